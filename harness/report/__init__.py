"""What did the run find, shown: the results schema, self-contained HTML pages and their plots.

Modules:
- results: a suite run's JSON, written atomically after every test; run_load reads one back
  (validated against run_results.schema.json); machine: the machine line from its environment;
- verdicts: one verdict per suite, the answer a report opens with;
- run_html: a pytest run's HTML report; bench_html: the serving (bench) report; index: reports/index.html
  over every run; pages: the pages a run produced besides its own report, linked both ways;
- html: page pieces shared by every report; fmt: plain text for values; plots: matplotlib figures as
  inline SVG; figures: figures kept as data in the results, drawn when a report is rendered.
"""
