"""Autoregressive baselines outside our own decoder: in-process ``transformers`` generate
(`hf_engine`) and an OpenAI-compatible server such as vLLM (`openai_client`, `vllm_server`).

The submodules are imported on demand: ``transformers`` and ``openai`` load only when used.
"""
