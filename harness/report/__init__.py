"""What did the run find, shown: the results schema, self-contained HTML pages and their plots.

Modules: results (the run's JSON, written atomically after every test), html (page pieces),
plots (matplotlib figures as inline images), bench_html (the serving report).
"""
