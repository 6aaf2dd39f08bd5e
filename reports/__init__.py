"""Trade-off reports: read pipeline artifacts (results/, metrics/, ablations/, dvc.lock), write
figures, tables and a Markdown + self-contained HTML report under ``reports/out/``.

Layering: this package reads files only. It never imports ``torch`` or ``setdiff`` (a test checks),
so it runs on any machine that has the artifacts.

By role, each layer importing only the ones above it (a test checks):
- `inputs`: reading a run's artifacts into tidy frames, and what is missing;
- `analysis`: pure statistics and findings over those frames;
- `render`: figures, tables, the look, and the Markdown / HTML document;
- `items`: the registry of figures and tables and the input kinds each reads;
- two command lines: `build` (the DVC stage ``report``) and `diff` (two runs side by side).
"""
