"""The preloaded image's warm jax (tpulab/emulator/hostenv.py `_warm_jax`).

The preloaded image shares one jax compilation cache among its nodes, so the verifier's
programs compile on the first emulated run only; the bare image stays like a real VM,
with no cache. These tests run the real verifier payload in the image's environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpulab.emulator.hostenv import bare_image_env, preloaded_image_env, session_env

PAYLOAD = Path(__file__).resolve().parents[1] / "remote_payloads" / "verify_tpu.py"


def _verify_in(env: dict[str, str], out: Path) -> dict[str, object]:
    command = [sys.executable, str(PAYLOAD), "--platform", "cpu", "--nonce", "n" * 32]
    done = subprocess.run(
        [*command, "--out", str(out)],
        env={**env, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # jax warns here when it cannot use its cache (a directory it cannot make or read).
    assert "persistent compilation cache" not in done.stderr, done.stderr
    receipt = json.loads(out.read_text())
    assert isinstance(receipt, dict)
    return receipt


def test_preloaded_nodes_share_compiled_programs_and_the_bare_image_has_none(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "shared"
    preloaded = preloaded_image_env(cache_dir=cache)
    env = session_env(preloaded, tmp_path / "vm-home", "tpu")
    (tmp_path / "vm-home").mkdir()
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(cache / "jax-compilation-cache")

    first = _verify_in(env, tmp_path / "first.json")
    entries = sorted(p.name for p in (cache / "jax-compilation-cache").iterdir())
    # Every program the verifier compiles, however quickly, is kept for the next node.
    assert len([name for name in entries if name.endswith("-cache")]) >= 4, entries
    second = _verify_in(env, tmp_path / "second.json")
    # The same receipt figures either way: the cache changes when programs compile,
    # never what they compute.
    for part in ("pmap", "placement", "reversal", "changed_bias"):
        assert first[part] == second[part], part
    assert sorted(p.name for p in (cache / "jax-compilation-cache").iterdir()) == entries

    bare = session_env(bare_image_env(tmp_path / "bare", cache_dir=tmp_path / "bare-cache"),
                       tmp_path / "vm-home", "tpu")  # fmt: skip
    assert not any(name.startswith("JAX_") for name in bare), sorted(bare)


def test_a_cache_directory_that_cannot_be_made_leaves_the_image_cold(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    preloaded = preloaded_image_env(cache_dir=blocker / "cache")
    assert not any(name.startswith("JAX_") for name in preloaded.extra)
    (tmp_path / "vm-home").mkdir()
    receipt = _verify_in(session_env(preloaded, tmp_path / "vm-home", "tpu"), tmp_path / "r.json")
    assert receipt["ok"] is True


def test_both_images_keep_the_machines_certificates_and_proxies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real VM has its network configured: a session's `--with` (or `tpulab notebook`'s
    jupyterlab) installs from the index on either image. The preloaded one lacked the
    machine's CA bundle, so behind a TLS-inspecting proxy uv failed 'invalid peer
    certificate: UnknownIssuer' (by hand, `tpulab notebook` on a preloaded session)."""
    monkeypatch.setenv("SSL_CERT_FILE", "/etc/the-machines-ca.pem")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    (tmp_path / "vm-home").mkdir()
    images = {
        "preloaded": preloaded_image_env(cache_dir=tmp_path / "cache"),
        "bare": bare_image_env(tmp_path / "bare", cache_dir=tmp_path / "bare-cache"),
    }
    for name, image in images.items():
        env = session_env(image, tmp_path / "vm-home", "tpu")
        assert env.get("SSL_CERT_FILE") == "/etc/the-machines-ca.pem", name
        assert env.get("HTTPS_PROXY") == "http://proxy.example:3128", name
