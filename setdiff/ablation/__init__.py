"""Ablation studies of set size, ordering and decoding, one package; Optuna lives in ``flows/``
and nothing here imports it.

- `knobs`: what each knob is and when it applies (`KNOBS`, `Knob.when`), one knob's range
  (`KnobSpace`), the metrics a trial reports (`METRICS`);
- `spec`: the preset's ``ablation`` section (`AblationConfig`) and what the flow sends one trial
  (`TrialSpec`);
- `space`: the search space resolved against a preset, every point validated before any trial
  (`search_space`, `resolve_space`: what ``setdiff trial --space`` writes for the flow);
- `trial`: one trial, the one plain function the flow runs (`run_trial`: train or load, decode,
  write ``result.json``), from knob values to a paradigm config and decode options
  (`resolve_trial`);
- `pruning`: the median rule that stops a training trial (`should_prune`), and why it is not
  Optuna's ``MedianPruner``.

The flows (``flows/ablation.py``, ``flows/study.py``) ask Optuna for knob values, run
``setdiff trial`` (`setdiff.stages.trial`) once per trial and tell Optuna the result.
"""
