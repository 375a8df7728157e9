"""The book: one Markdown chapter per stage of a request's path, and the tools that build and check it
(``book.py`` the site, ``code_links.py`` its pages of source code, ``pictures.py`` the chapters'
committed pictures, ``host_path_picture.py`` chapter 6's bars). They import the engine and ``viz``;
nothing in either imports them."""
