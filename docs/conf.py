"""Sphinx configuration of the course website, built by `python -m tools.site` from a source tree it
assembles (the notebooks, a table of contents in their order, the API reference pages). The stack is
Jupyter Book 1's: myst-nb reads the notebooks with their committed outputs, sphinx-book-theme lays
out the pages, sphinx-external-toc reads the table of contents."""

project = 'exp: deep learning from the foundations'
author = 'The exp authors'
copyright = '2026 onwards, The exp authors'

extensions = [
    'myst_nb',
    'sphinx_external_toc',
    'sphinx_book_theme',
    # MathJax served from the site itself: no CDN, the pages work offline
    'sphinx-mathjax-offline',
]
external_toc_path = '_toc.yml'
exclude_patterns = ['_build', '**.ipynb_checkpoints']

# the pages show the outputs committed in the notebooks (python -m tools.outputs)
nb_execution_mode = 'off'
nb_merge_streams = True
myst_enable_extensions = ['dollarmath', 'amsmath', 'colon_fence']
myst_heading_anchors = 3  # links to a guide's sections (#the-trainer), as on a code host

html_theme = 'sphinx_book_theme'
html_title = project
html_favicon = 'favicon.png'
html_context = {'default_mode': 'auto'}  # light or dark as the reader's system prefers
html_theme_options = {
    'home_page_in_toc': True,
    'show_toc_level': 2,
    'use_download_button': True,
    'use_fullscreen_button': False,
}
html_sourcelink_suffix = ''  # the download button gives the .ipynb itself

# the site's own CSS (docs/custom.css, copied to _static by tools/site.py)
html_static_path = ['_static']
html_css_files = ['custom.css']
