"""`diffeval view`: browse run folders sample by sample, DIFF and baseline side by side, in the browser.

data.py reads the folders (the same readers, tables and pairing as `report`); server.py serves the page and its JSON
on 127.0.0.1; export.py writes the same page as static files. The page itself is static/ (HTML, CSS, plain JS):
nothing is fetched from outside, so it works offline.
"""
