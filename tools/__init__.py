"Developer tools for the notebooks: refreshing their committed outputs, building and checking the course website."
