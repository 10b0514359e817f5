"""Developer tools: refreshing the notebooks' outputs, building and checking the course website,
rebuilding the embedded digits."""
