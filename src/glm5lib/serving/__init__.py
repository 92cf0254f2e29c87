"""Serving GLM-5 with vLLM from the outside: start and probe a server, talk to it, diagnose a target, plan a
deployment, and exercise the plugin's CUDA call path without vLLM.

Modules: `server` (start/probe/stop a vLLM OpenAI server), `client` (OpenAI requests, comparison with the
reference forward), `doctor` (which backend and indexer vLLM picks, and why), `plan` (weights per GPU, KV tokens, a
decode estimate and the vLLM command, from headers), `harness` (the backend's forward and the indexer op on
vLLM-shaped inputs, on a GPU without vLLM), `cli` (`glm5lib doctor | plan | serve`).

Nothing here is imported by the plugin that vLLM loads in every process (`glm5lib.vllm_plugin`): a change
that vLLM must see inside its processes goes there, one that drives vLLM from outside goes here (floor 6).
"""
