"""A small AR draft model for the arith task (the draft of `python -m setdiff.bench.lossless
--draft OUT_DIR`), trained with the library's own loop on a finished run's encoded data and saved
as a model directory. Not a pipeline stage yet (issue 34 asks for one); this is how the draft of
docs/results.md ("Lossless decoders against AR with speculative decoding") was made:

    .venv/bin/python scripts/train_draft.py RUN_DIR OUT_DIR 1 64 1500   # 44K parameters, ~36 s
usage: scripts/train_draft.py RUN_DIR OUT_DIR [n_layer d_model steps]"""

import sys
from pathlib import Path

import torch

from setdiff.artifacts import save_model_dir
from setdiff.batching import ArraySplit
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import make_paradigm
from setdiff.tokenizer import load_tokenizer
from setdiff.train import TrainConfig, train

run, out = Path(sys.argv[1]), Path(sys.argv[2])
n_layer, d_model, steps = (int(x) for x in (sys.argv[3:] or ["1", "64", "1500"]))
tok = load_tokenizer(run / "data/arith/tokenizer/tokenizer.json")
tr = ArraySplit.load(run / "data/arith/encoded/train.npz")
va = ArraySplit.load(run / "data/arith/encoded/valid.npz")
config = ModelConfig(
    vocab_size=tok.vocab_size,
    n_layer=n_layer,
    n_head=2,
    n_kv_head=2,
    d_model=d_model,
    d_ff=2 * d_model,
    max_seq_len=tr.seq_len,
)
torch.manual_seed(0)
net = Transformer(config)
paradigm = make_paradigm("ar", mask_id=tok.mask_id)
cfg = TrainConfig(
    steps=steps,
    batch_size=64,
    lr=3e-3,
    warmup_steps=min(100, steps),
    eval_every=500,
    eval_examples=256,
    checkpoint_every=10**6,
    threads=1,
)
result = train(net, paradigm, tr, va, cfg)
save_model_dir(
    out,
    net,
    paradigm,
    tokenizer_file=run / "data/arith/tokenizer/tokenizer.json",
    state_dict=result.weights,
    extra={"task": "arith"},
)
print(
    "draft",
    net.num_parameters(),
    "params; eval loss",
    result.final_eval_loss,
    "in",
    round(result.seconds),
    "s",
)
