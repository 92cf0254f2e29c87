"""Serving GLM-5 with vLLM from the outside: start and probe a server, talk to it, diagnose a target, plan a
deployment, and exercise the plugin's CUDA call path without vLLM.

Modules: `server` (start/probe/stop a vLLM OpenAI server), `client` (OpenAI requests, comparison with the
reference forward), `doctor` (which backend and indexer vLLM picks, and why), `harness` (the backend's forward and
the indexer op on vLLM-shaped inputs, on a GPU without vLLM), `cli` (`glm5lib doctor | serve`).

Nothing here is imported by the plugin that vLLM loads in every process (`glm5lib.vllm_plugin`).
"""
