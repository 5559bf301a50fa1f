"""The package as a user gets it from PyPI: the source distribution built from this
checkout holds what the kernel's build needs, and a new venv (not this one, and not the
checkout) that installs it compiles the kernel, holds only the package, and answers a
prompt through its own `llm`.

The sdist is built with `python -m build --sdist` and installed with the new venv's pip;
dependencies come from PyPI. Nothing is taken from pip's wheel cache, so the kernel is
compiled from the sdist every run."""

from __future__ import annotations

import email.parser
import json
import os
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.run_once import once_per_run

ROOT = Path(__file__).resolve().parent.parent

# Printed by the new venv's python: where the package and its kernel were imported from,
# and what the installed distribution holds.
PROBE = r"""
import json, sys
from importlib import metadata
import llm_smolq
import llm_smolq._kernel as kernel
dists = [d for d in metadata.distributions() if d.metadata["Name"] == "llm-smolq"]
print(json.dumps({
    "prefix": sys.prefix,
    "package": llm_smolq.__file__,
    "kernel": kernel.__file__,
    "simd": kernel.ffi.string(kernel.lib.sq_simd_name()).decode(),
    "dists": len(dists),
    "files": [str(f) for f in dists[0].files],
}))
"""


def run(cmd: list, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def clean_env() -> dict[str, str]:
    """This process's environment without what would point a child at this venv."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PYTHONUSERBASE"}
    return {k: v for k, v in os.environ.items() if k not in drop}


@dataclass
class Installed:
    venv: Path
    pip_output: str
    probe: dict
    env: dict[str, str]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    """The sdist, built once per run: setuptools writes into the checkout while it builds,
    so two workers building at once would trip over each other."""
    def make(out: Path) -> dict:
        run([sys.executable, "-m", "build", "--sdist", "--outdir", out, ROOT], timeout=300, cwd=ROOT)
        (path,) = out.glob("llm_smolq-*.tar.gz")
        return {"path": str(path)}

    return Path(once_per_run(tmp_path_factory, "sdist", make)["path"])


def sdist_members(path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    top = members[0].name.split("/")[0]
    return {m.name.split("/", 1)[1]: m for m in members if "/" in m.name and m.name.split("/")[0] == top}


def runtime_requirements(path: Path) -> list[str]:
    """The sdist's Requires-Dist lines outside any extra."""
    with tarfile.open(path) as tar:
        top = tar.getmembers()[0].name.split("/")[0]
        pkg_info = tar.extractfile(f"{top}/PKG-INFO").read().decode()
    requires = email.parser.Parser().parsestr(pkg_info).get_all("Requires-Dist") or []
    return [r for r in requires if "extra ==" not in r]


@pytest.fixture(scope="module")
def installed(sdist, tmp_path_factory) -> Installed:
    """A new venv with the sdist installed from PyPI's dependencies, made once per run."""
    def make(work: Path) -> dict:
        venv = work / "venv"
        env = clean_env()
        # This interpreter is a venv's: `-m venv` makes the new one from the base Python, and
        # without --system-site-packages it sees neither this venv nor its editable install.
        run([sys.executable, "-m", "venv", venv], timeout=120, cwd=work, env=env)
        pip = [venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check"]
        requirements = runtime_requirements(sdist)
        assert any(r.startswith("llm") for r in requirements), requirements
        # --no-compile: the dependencies' bytecode is written when imported (a third of the install).
        run([*pip, "install", "-q", "--no-compile", *requirements], timeout=600, cwd=work, env=env)
        # --no-cache-dir: never a wheel built on an earlier run; the kernel is compiled here.
        built = run([*pip, "install", "--no-deps", "--no-cache-dir", sdist], timeout=600, cwd=work, env=env)
        run([*pip, "check"], timeout=120, cwd=work, env=env)
        probe = run([venv / "bin" / "python", "-c", PROBE], timeout=120, cwd=work, env=env)
        return {"venv": str(venv), "pip_output": built.stdout + built.stderr, "probe": json.loads(probe.stdout),
                "env": env}

    made = once_per_run(tmp_path_factory, "installed", make)
    return Installed(Path(made["venv"]), made["pip_output"], made["probe"], made["env"])


def test_the_sdist_holds_the_kernel_sources_and_its_builder_but_no_tests(sdist):
    names = set(sdist_members(sdist))
    needed = {"native/smolq.h", "cffi_build/build_kernel.py", "cffi_build/check_wheel.py", "setup.py", "pyproject.toml", "MANIFEST.in",
              "README.md", "LICENSE", "PKG-INFO", "docs/design.md", "docs/development.md"}
    assert needed <= names, needed - names
    native = {p.relative_to(ROOT).as_posix() for p in (ROOT / "native").rglob("*") if p.suffix in (".c", ".h")}
    assert native and native <= names, native - names
    package = {p.relative_to(ROOT).as_posix() for p in (ROOT / "llm_smolq").rglob("*.py") if "__pycache__" not in p.parts}
    assert package <= names, package - names
    assert not [n for n in names if n.split("/")[0] in ("tests", "build", ".ci", ".models", ".venv")]
    assert not [n for n in names if n.endswith((".so", ".o", ".pyc", ".gguf"))]
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "llm-smolq contributors" in (ROOT / "LICENSE").read_text()


def test_the_new_venv_compiled_the_kernel_and_holds_only_the_package(installed):
    venv = installed.venv.resolve()
    probe = installed.probe
    assert Path(probe["prefix"]).resolve() == venv
    assert probe["dists"] == 1  # not also this venv's editable install
    for key in ("package", "kernel"):
        path = Path(probe[key]).resolve()
        assert path.is_relative_to(venv) and not path.is_relative_to(ROOT), (key, path)
    assert Path(probe["kernel"]).name == "_kernel.abi3.so"
    assert probe["simd"]
    # pip built the wheel from the sdist (one abi3 wheel serves 3.10 and later).
    assert re.search(r"Created wheel for llm-smolq: filename=llm_smolq-0\.1\.0-cp310-abi3-linux_\w+\.whl",
                     installed.pip_output), installed.pip_output
    files = probe["files"]
    assert "llm_smolq/_kernel.abi3.so" in files and "llm_smolq/plugin/__init__.py" in files
    tops = {f.split("/")[0] for f in files}
    assert tops == {"llm_smolq", "llm_smolq-0.1.0.dist-info"}, tops
    assert not [f for f in files if {"tests", "build", "native", "cffi_build"} & set(f.split("/"))]
    assert any(f.endswith("dist-info/licenses/LICENSE") for f in files)
    # The development tools are in llm_smolq.dev, not beside the runtime modules, and run from there.
    tools = {"bench", "follow_up_bench", "synth", "fuzz_gguf", "gguf_mutations", "answer_survey", "fidelity", "ik_llama"}
    assert {f"llm_smolq/dev/{t}.py" for t in tools | {"__init__"}} <= set(files)
    assert not {f"llm_smolq/{t}.py" for t in tools} & set(files)
    python = installed.venv / "bin" / "python"
    usage = run([python, "-m", "llm_smolq.dev.synth", "--help"], timeout=120, cwd=installed.venv, env=installed.env)
    assert usage.stdout.startswith("usage: python -m llm_smolq.dev.synth")


def test_the_new_venvs_llm_gives_the_engines_greedy_answer_on_the_real_model(installed, smollm2_gguf, france,
                                                                             smollm2_chat_cases, smollm2_greedy,
                                                                             tmp_path):
    home = tmp_path / "llm-home"
    (home / "smolq").mkdir(parents=True)
    (home / "smolq" / smollm2_gguf.name).symlink_to(smollm2_gguf)
    env = {**installed.env, "LLM_USER_PATH": str(home)}
    llm = installed.venv / "bin" / "llm"
    plugins = json.loads(run([llm, "plugins"], timeout=120, cwd=tmp_path, env=env).stdout)
    assert "llm-smolq" in [p["name"] for p in plugins]
    (question,) = [m["content"] for m in france["messages"]]
    # Greedy with the F32 cache: the tokens this process's engine gives (the same source,
    # the same bits; tests/plugin/test_llm_greedy_answers.py).
    answer = run([llm, "-m", "smollm2-q", "-o", "max_tokens", "6", "-o", "temperature", "0", "-o", "kv_cache", "f32",
                  question], timeout=180, cwd=tmp_path, env=env).stdout.rstrip("\n")
    ours = smollm2_greedy[smollm2_chat_cases.index(france)][:6]
    assert 2 not in ours, "the answer ends within 6 tokens: ask a question with a longer answer"
    import llm_smolq  # this process's engine, from the checkout

    expected = llm_smolq.load(smollm2_gguf, n_ctx=64).detokenize(ours)
    assert re.search(r"\w", answer) and answer == expected, (answer, expected)
    (logged,) = json.loads(run([llm, "logs", "-n", "1", "--json"], timeout=120, cwd=tmp_path, env=env).stdout)
    assert logged["model"] == "smollm2-q" and logged["prompt"] == question and logged["response"] == answer
    assert logged["output_tokens"] == 6 and logged["response_json"]["finish_reason"] == "length"
    assert Path(logged["response_json"]["model_file"]) == home / "smolq" / smollm2_gguf.name


def test_the_wheel_settings_cover_each_platform_and_their_check_runs_on_the_installed_package(tmp_path):
    """cibuildwheel builds for Linux, macOS and Windows, and its test command, run outside
    the checkout as cibuildwheel runs it, passes on the package installed here."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: pip carries the same parser
        from pip._vendor import tomli as tomllib

    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
    builds = set(settings["build"].split())
    assert {"cp3*-manylinux_x86_64", "cp3*-manylinux_aarch64", "cp3*-macosx_arm64", "cp3*-macosx_x86_64",
            "cp3*-win_amd64"} <= builds, builds
    assert settings["macos"]["archs"] == ["arm64", "x86_64"] and settings["windows"]["archs"] == ["AMD64"]
    command = settings["test-command"].replace("{project}", str(ROOT)).split()
    assert command[0] == "python"
    check = run([sys.executable, *command[1:]], timeout=120, cwd=tmp_path, env=clean_env())
    assert check.stdout.count("llm-smolq kernel ok:") == 2, check.stdout
