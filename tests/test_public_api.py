"""The top-level API: `import glm5lib` is cheap (no torch), `dir()` lists the public names, `help()` documents
each, and every name resolves to the object its module defines."""

import importlib
import subprocess
import sys

import glm5lib


def test_import_is_cheap_and_dir_lists_the_api():
    code = ("import sys, glm5lib; print(sorted(m for m in ('torch', 'vllm', 'transformers', 'triton', 'numpy') "
            "if m in sys.modules)); print(' '.join(dir(glm5lib)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    heavy, names = r.stdout.splitlines()
    assert heavy == "[]"
    for name in ("open_gguf", "merge", "split", "map_check", "export_hf", "reference_from_gguf", "ReferenceModel",
                 "sparse_mla", "plan", "diagnose", "ensure_tiny"):
        assert name in names.split(), name


def test_every_public_name_resolves_and_is_documented():
    doc = glm5lib.__doc__
    for name, (module, attr) in glm5lib._EXPORTS.items():
        assert f"glm5lib.{name}" in doc, name
        mod = importlib.import_module(module)
        assert getattr(glm5lib, name) is (mod if attr is None else getattr(mod, attr)), name
    assert glm5lib.map_check.__module__ == "glm5lib.mapping.inventory"
    try:
        glm5lib.no_such_name
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("unknown names must raise AttributeError")


def test_prepared_model_directories_go_to_the_user_cache(monkeypatch, tmp_path):
    from glm5lib import paths
    from glm5lib.vllm_plugin.gguf_loader import default_model_dir

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.delenv("GLM5LIB_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_model_dir(gguf).parent == tmp_path / "xdg" / "glm5lib" / "vllm-gguf"
    assert paths.cache_dir() == paths.repo_root() / ".cache"  # the tiny model stays beside the checkout
    monkeypatch.setenv("GLM5LIB_CACHE", str(tmp_path / "c"))
    assert default_model_dir(gguf).parent == tmp_path / "c" / "vllm-gguf"


def test_relative_paths_resolve_from_the_checkout_not_the_working_directory(monkeypatch, tmp_path):
    from glm5lib import paths

    monkeypatch.chdir(tmp_path)
    assert paths.resolve("outputs/bench/bench_h200.json") == paths.bench_dir() / "bench_h200.json"
    assert (paths.bench_dir() / "bench_h200.json").is_file()
    assert paths.resolve(tmp_path / "x") == tmp_path / "x"
