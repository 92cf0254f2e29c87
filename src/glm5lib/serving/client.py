"""Talk to a running vLLM OpenAI server: greedy completions with token ids and logprobs, chat, a concurrent
burst, malformed requests, and the comparison with glm5lib's reference forward.

Token ids come back as `token_id:N` strings (`return_tokens_as_token_ids`), so the comparison with the reference
is on ids, not on detokenized text.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

from glm5lib.serving.server import post_json


@dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    seconds: float


def openai_client(base_url: str, timeout: float = 300.0):
    from openai import OpenAI

    return OpenAI(base_url=base_url, api_key="EMPTY", timeout=timeout, max_retries=0)


def _ids(tokens: Sequence[str]) -> list[int]:
    return [int(t.split(":", 1)[1]) for t in tokens]


def complete_greedy(client: Any, model: str, prompt_ids: list[int], max_tokens: int) -> Completion:
    t0 = time.time()
    r = client.completions.create(model=model, prompt=prompt_ids, max_tokens=max_tokens, temperature=0.0,
                                  logprobs=1, extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True})
    choice = r.choices[0]
    lp = choice.logprobs
    return Completion(list(prompt_ids), _ids(lp.tokens), [float(x) for x in lp.token_logprobs], choice.text,
                      time.time() - t0)


def chat_greedy(client: Any, model: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0.0,
                                       logprobs=True, top_logprobs=2)
    c = r.choices[0]
    return {"text": c.message.content, "finish_reason": c.finish_reason,
            "logprobs": [t.logprob for t in (c.logprobs.content or [])],
            "prompt_tokens": r.usage.prompt_tokens, "completion_tokens": r.usage.completion_tokens}


def burst(client: Any, model: str, prompts: list[list[int]], max_tokens: int, concurrency: int) -> dict[str, Any]:
    """All prompts at once (up to `concurrency` in flight): completions, wall time, generated tokens/s."""
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda p: _safe(complete_greedy, client, model, p, max_tokens), prompts))
    wall = time.time() - t0
    ok = [r for r in results if isinstance(r, Completion)]
    n_tokens = sum(len(r.token_ids) for r in ok)
    return {"results": results, "n_ok": len(ok), "n_failed": len(results) - len(ok), "wall_s": wall,
            "generated_tokens": n_tokens, "tokens_per_s": n_tokens / wall if wall > 0 else 0.0,
            "latency_s": sorted(r.seconds for r in ok)}


def _safe(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # a failed request is a result to report, not a crash of the burst
        return exc


def malformed_requests(base_url: str, model: str, max_model_len: int) -> dict[str, int]:
    """HTTP status of requests a server must refuse with 4xx (and survive)."""
    url = base_url + "/completions"
    too_long = list(range(10, 10 + max_model_len + 8))
    cases = {
        "bad_json": ({}, b'{"model": "x", "prompt": [1, 2'),
        "unknown_model": ({"model": "no-such-model", "prompt": "hi", "max_tokens": 2}, None),
        "prompt_too_long": ({"model": model, "prompt": too_long, "max_tokens": 2}, None),
        "negative_max_tokens": ({"model": model, "prompt": "hi", "max_tokens": -1}, None),
        "missing_prompt": ({"model": model, "max_tokens": 2}, None),
    }
    return {name: post_json(url, body, raw=raw)[0] for name, (body, raw) in cases.items()}


def compare_with_reference(completions: list[Completion], reference: Any) -> dict[str, Any]:
    """Greedy tokens and their logprobs from the server vs `reference.generate_greedy` (glm5lib ReferenceModel)."""
    same = True
    max_diff = 0.0
    rows = []
    for c in completions:
        ref_tokens, ref_lp = reference.generate_greedy(c.prompt_ids, len(c.token_ids))
        n = min(len(ref_tokens), len(c.token_ids))
        equal = ref_tokens[:n] == c.token_ids[:n] and len(ref_tokens) == len(c.token_ids)
        diff = max((abs(a - b) for a, b in zip(ref_lp[:n], c.logprobs[:n])), default=0.0)
        same &= equal
        max_diff = max(max_diff, diff)
        rows.append({"prompt_len": len(c.prompt_ids), "tokens_equal": equal, "max_abs_logprob_diff": diff})
    return {"tokens_equal": same, "max_abs_logprob_diff": max_diff, "per_prompt": rows}


def prompt_set(vocab_size: int, lengths: Sequence[int], seed: int = 0) -> list[list[int]]:
    """Deterministic token-id prompts of the given lengths (ids >= 10: past the chat special tokens)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(10, vocab_size, (n,), generator=g).tolist() for n in lengths]


def plot_burst(burst_result: dict[str, Any], path: str, title: str = "") -> str:
    """Latency histogram of a burst (client side), saved to `path` (temp file + rename)."""
    from glm5lib.plotting import pyplot, save_figure

    fig, ax = pyplot().subplots(figsize=(6, 3.2))
    ax.hist(burst_result["latency_s"], bins=16, color="#4c72b0")
    ax.set_xlabel("request latency (s)")
    ax.set_ylabel("requests")
    ax.set_title(title or f"{burst_result['n_ok']} concurrent requests, {burst_result['tokens_per_s']:.1f} tok/s")
    fig.tight_layout()
    return str(save_figure(fig, path))


def metric_total(metrics: dict[str, float], name: str) -> float:
    """Sum of a Prometheus counter over its label sets (e.g. 'vllm:generation_tokens_total')."""
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def chat_widget(client: Any, model: str, server: Any = None, *, max_tokens: int = 32):
    """JupyterLab explorer: send a chat message to the running server, see the reply and each token's logprob.
    With `server`, a button stops it (it also dies with the kernel)."""
    import ipywidgets as W

    text = W.Textarea(value="What does the DSA indexer select?", layout=W.Layout(width="100%"))
    n = W.IntSlider(value=max_tokens, min=1, max=256, description="max tokens")
    send = W.Button(description="Send", button_style="primary")
    stop = W.Button(description="Stop server", button_style="danger", disabled=server is None)
    out = W.Output()

    def on_send(_):
        with out:
            out.clear_output()
            try:
                r = chat_greedy(client, model, [{"role": "user", "content": text.value}], n.value)
            except Exception as exc:  # shown to the user, not raised into the widget machinery
                print(f"error: {exc}")
                return
            print(repr(r["text"]))
            print(f"{r['prompt_tokens']} prompt + {r['completion_tokens']} completion tokens, finish: {r['finish_reason']}")
            print("token logprobs:", [round(x, 3) for x in r["logprobs"]])

    def on_stop(_):
        with out:
            print("server stopped:", server.stop())
        send.disabled = stop.disabled = True

    send.on_click(on_send)
    stop.on_click(on_stop)
    return W.VBox([text, W.HBox([n, send, stop]), out])
