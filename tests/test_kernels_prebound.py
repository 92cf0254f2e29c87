"""`kernels.common.Prebound`: the compiled kernel is reused per specialization key and launched with Triton's
launcher convention; a new key (alignment, an int becoming 1 or a multiple of 16, other constexprs) goes through
Triton again; a launcher that refuses the call turns the shortcut off. Triton itself is faked here (on CPU the
interpreter never takes the shortcut); the GPU harness checks real launches give identical outputs."""

import pytest
import torch

from glm5lib.kernels import common


class FakeCompiled:
    function, packed_metadata = "fn-handle", "packed"

    def __init__(self, log, refuse=False):
        self.log, self.refuse = log, refuse

    def run(self, *a):
        if self.refuse:
            raise TypeError("function takes 12 arguments")
        self.log.append(("run", a))


class FakeKernel:
    arg_names = ["X", "n", "scale", "FLAG", "BLOCK"]

    def __init__(self, refuse=False):
        self.log, self.refuse = [], refuse

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.log.append(("triton", grid, args, kw))
            return FakeCompiled(self.log, self.refuse)
        return launch


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setattr(common, "PREBOUND", True)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(common, "current_stream", lambda index: 77)


def test_prebound_reuses_per_specialization(on):
    k = FakeKernel()
    pb = common.Prebound(k)
    x = torch.zeros(64)
    pb((4, 2), x, 48, 0.5, FLAG=True, BLOCK=32, num_warps=4)  # first: Triton binds and compiles
    pb((8,), x, 96, 0.25, FLAG=True, BLOCK=32, num_warps=4)  # same key (48 and 96 both multiples of 16)
    assert [e[0] for e in k.log] == ["triton", "run"]
    assert k.log[1][1] == (8, 1, 1, 77, "fn-handle", "packed", None, None, None, x, 96, 0.25, True, 32)
    pb((8,), x, 1, 0.25, FLAG=True, BLOCK=32, num_warps=4)  # n == 1: Triton specializes it, a new key
    pb((8,), x[1:], 96, 0.25, FLAG=True, BLOCK=32, num_warps=4)  # misaligned pointer: a new key
    pb((8,), x, 96, 0.25, FLAG=False, BLOCK=32, num_warps=4)  # another constexpr: a new key
    assert [e[0] for e in k.log] == ["triton", "run", "triton", "triton", "triton"]


def test_prebound_falls_back_when_the_launcher_refuses(on):
    k = FakeKernel(refuse=True)
    pb = common.Prebound(k)
    x = torch.zeros(16)
    for _ in range(3):
        pb((1,), x, 16, 1.0, FLAG=False, BLOCK=16)
    assert pb.broken and "TypeError" in pb.broken
    assert [e[0] for e in k.log] == ["triton", "triton", "triton"]


def test_prebound_off_is_the_plain_launch(monkeypatch):
    monkeypatch.setattr(common, "PREBOUND", False)
    k = FakeKernel()
    pb = common.Prebound(k)
    for _ in range(2):
        pb((1,), torch.zeros(16), 16, 1.0, FLAG=False, BLOCK=16)
    assert [e[0] for e in k.log] == ["triton", "triton"]


@pytest.mark.parametrize("env,version,want", [
    (None, "3.6.0", True), (None, "3.6.1", True),  # the version the GPU harness checked
    (None, "3.5.1", False), (None, "3.9.0", False), (None, "4.0.0+git", False), (None, "weird", False),
    ("0", "3.6.0", False), ("1", "3.9.0", True), ("yes", "3.9.0", False),
])
def test_prebound_default_is_on_only_where_checked(env, version, want):
    assert common._prebound_default(env, version) is want
