"""The implementation under test: parse ``--zero3-impl``, check it, and apply it inside a rank.

The SPEC is chosen once per pytest run and every rank reaches it through this module:

``installed``
    the ``deepspeed`` importable in this environment, unchanged.
``reference``
    the installed deepspeed with :mod:`reference_impl` installed (our coordinator and fixes).
``DIR``
    a directory holding a ``deepspeed/`` package (a fork checkout).  It is put first on the import
    path of this process, of the forkserver and of every rank, before any of them imports deepspeed.
``module.path:Class`` / ``path/to/file.py:Class``
    a coordinator class used in place of DeepSpeed's ``PartitionedParameterCoordinator`` in the
    installed deepspeed, with the reference's fixes outside the coordinator (``FWD_MODULE_STACK``
    holding modules after ``destroy()``; the adaptive-prefetch config keys) installed around it.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import os
import sys

from packaging.version import InvalidVersion, Version

from pytest_zero3 import accel, protocol

#: Oldest deepspeed the plugin runs on at all: the harness reads DeepSpeed's ZeRO-3 internals as they
#: are from 0.14.0 on, and it is not built for older ones.
MIN_DEEPSPEED = "0.14.0"
#: Releases the release matrix runs the whole suite against (scripts/release-matrix.sh RELEASES; the
#: manual's docs/results/release-matrix.md).  An older base runs, with an "untested base" warning.
MATRIX_RELEASES = ("0.14.5", "0.15.4", "0.16.9", "0.17.6", "0.18.9", "0.19.2", "0.19.3", "0.19.8")
#: Oldest deepspeed the reference (and a ``module:Class`` spec, which runs inside it) works with: it
#: wraps ``DeepSpeedZeRoOffload.release_backward_leftovers``, which DeepSpeed added in 0.19.3 with the
#: activation-checkpoint fix.
MIN_DEEPSPEED_REFERENCE = "0.19.3"

#: The implementation of the forkserver being loaded (set by :mod:`pytest_zero3.preload` before it imports
#: the preloads): a preload that runs DeepSpeed code for the ranks to inherit (the compile profile's
#: warm-up) runs it as the ranks will (:func:`apply`); None outside a forkserver.
loading: Spec | None = None


class SpecError(Exception):
    """A ``--zero3-impl`` value that cannot work; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class Spec:
    text: str
    kind: str  # "installed" | "reference" | "fork" | "class"
    fork_dir: str | None = None
    module: str | None = None  # importable module name, or a .py file path
    cls_name: str | None = None

    @property
    def label(self) -> str:
        return {
            "installed": "installed deepspeed",
            "reference": "reference coordinator",
            "fork": f"deepspeed fork at {self.fork_dir}",
            "class": f"coordinator class {self.module}:{self.cls_name}",
        }[self.kind]


def parse(text: str, option: str = "--zero3-impl") -> Spec:
    """Turn the option value into a :class:`Spec`, checking only what needs no import; ``option`` is
    the option the value came from (``--zero3-baseline`` takes the same SPECs), named in errors."""
    text = (text or "installed").strip()
    if text in ("installed", "reference"):
        return Spec(text, text)
    if ":" in text and not os.path.isdir(text):
        module, _, cls_name = text.rpartition(":")
        if not module or not cls_name.isidentifier():
            raise SpecError(f"{option}={text!r}: expected 'module.path:Class' or 'path/to/file.py:Class'.")
        if module.endswith(".py"):
            path = os.path.abspath(module)
            if not os.path.isfile(path):
                raise SpecError(
                    f"{option}={text!r}: file {module!r} does not exist. "
                    "Give the path of the .py file that defines the coordinator class."
                )
            module = path
        return Spec(text, "class", module=module, cls_name=cls_name)
    path = os.path.abspath(text)
    if not os.path.exists(path):
        raise SpecError(
            f"{option}={text!r}: no such path. Use 'installed', 'reference', a DeepSpeed "
            "checkout directory, or 'module:Class' / 'file.py:Class'."
        )
    if not os.path.isdir(path):
        raise SpecError(f"{option}={text!r} is a file; for a coordinator class write '{text}:ClassName'.")
    if not os.path.isfile(os.path.join(path, "deepspeed", "__init__.py")):
        raise SpecError(
            f"{option}={text!r}: directory has no 'deepspeed/__init__.py'. Point it at the root "
            "of a DeepSpeed checkout (the directory that contains the 'deepspeed' package)."
        )
    return Spec(text, "fork", fork_dir=path)


def import_path(spec: Spec) -> str | None:
    """The directory to put first on the import path of pytest, the forkserver and every rank, if any."""
    return spec.fork_dir if spec.kind == "fork" else None


def extensions_dir(spec: Spec) -> str:
    """A JIT extension directory of this deepspeed version and path (set unless the user set one).

    DeepSpeed builds its CPU comm op there; two versions sharing torch's default directory load each
    other's builds, and torch rebuilds an op whose sources or include paths changed, so one directory
    per package path keeps a fork and the installed package from rebuilding each other's op.
    """
    import zlib

    info = describe_without_import(spec)
    tag = f"deepspeed-{info.get('deepspeed', 'unknown')}-{zlib.crc32(info.get('deepspeed_path', '').encode()):08x}"
    return os.path.join(os.path.expanduser("~"), ".cache", "pytest-zero3", "torch_extensions", tag)


def prepare_process(spec: Spec) -> None:
    """For scripts that start worlds outside pytest (benchmarks): the fork first on the import path,
    and :func:`extensions_dir` unless one is set.  Changes this process for good; the plugin does the
    same only for the length of a session that uses it."""
    path = import_path(spec)
    if path and sys.path[:1] != [path]:
        sys.path.insert(0, path)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir(spec))


def check_version(spec: Spec, option: str = "--zero3-impl") -> None:
    """:class:`SpecError` when the deepspeed this spec runs on is older than the harness can work with."""
    found = describe_without_import(spec).get("deepspeed", "")
    need = MIN_DEEPSPEED_REFERENCE if spec.kind in ("reference", "class") else MIN_DEEPSPEED
    have = parse_version(found)
    if have is None or have >= Version(need):
        return  # an unreadable version is reported in the header, not guessed at
    if spec.kind in ("reference", "class"):
        what = {
            "reference": "the reference coordinator",
            "class": "a coordinator class (it runs inside the reference's fixes)",
        }
        why = "it wraps DeepSpeedZeRoOffload.release_backward_leftovers, which DeepSpeed added in 0.19.3"
        raise SpecError(
            f"{option}={spec.text!r}: {what[spec.kind]} needs deepspeed >= {need}, found {found} ({why}). "
            f"Install a newer one (pip install 'deepspeed>={need}'), or run a fork as --zero3-impl=DIR."
        )
    raise SpecError(
        f"{option}={spec.text!r}: pytest-zero3 needs deepspeed >= {need}, found {found}: its harness "
        f"reads DeepSpeed's ZeRO-3 internals as they are from {need} on and is not built for older ones. "
        f"Run it on a base of {need} or later."
    )


def base_warning(spec: Spec) -> str | None:
    """The "untested base" line for a deepspeed older than the releases the release matrix runs, or None.

    Such a base runs (a fork lives on its base for long); the warning says its results have no
    measured release behind them.  Compared with the oldest release of the same minor series the
    matrix runs, else with the oldest of all.
    """
    found = describe_without_import(spec).get("deepspeed", "")
    have = parse_version(found)
    if have is None:
        return None
    runs = [Version(v) for v in MATRIX_RELEASES]
    series = [v for v in runs if v.release[:2] == have.release[:2]]
    oldest = min(series or runs)
    if have >= oldest:
        return None
    of = f" of {have.major}.{have.minor}" if series else ""
    return (
        f"untested base: deepspeed {found} is older than the oldest release the release matrix runs{of}, "
        f"{oldest}; results are not compared with a measured release"
    )


def parse_version(text: str) -> Version | None:
    """The version a deepspeed reports (a checkout's "0.20.1 (git 0123abcd)" included), or None when
    it is not a version."""
    try:
        return Version((text or "").split(" (", 1)[0].strip())
    except InvalidVersion:
        return None


def load_class(spec: Spec):
    """Import and return the coordinator class of a ``class`` spec; :class:`SpecError` if it cannot work."""
    module, cls_name = spec.module or "", spec.cls_name or ""
    try:
        if module.endswith(".py"):
            name = "pytest_zero3_impl_" + os.path.splitext(os.path.basename(module))[0]
            mod = sys.modules.get(name)
            if mod is None:
                loader_spec = importlib.util.spec_from_file_location(name, module)
                if loader_spec is None or loader_spec.loader is None:
                    raise ImportError(f"cannot load {module!r} as a module")
                mod = importlib.util.module_from_spec(loader_spec)
                sys.modules[name] = mod
                loader_spec.loader.exec_module(mod)
        else:
            mod = importlib.import_module(module)
    except Exception as exc:  # the user's module: any import failure is a usage error
        sys.modules.pop("pytest_zero3_impl_" + os.path.splitext(os.path.basename(module))[0], None)
        raise SpecError(
            f"--zero3-impl={spec.text!r}: importing {module!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    obj = getattr(mod, cls_name, None)
    if obj is None:
        raise SpecError(f"--zero3-impl={spec.text!r}: {module!r} has no attribute {cls_name!r}.")
    if not isinstance(obj, type):
        raise SpecError(f"--zero3-impl={spec.text!r}: {cls_name!r} is a {type(obj).__name__}, not a class.")
    missing = protocol.missing_methods(obj)
    if missing:
        raise SpecError(
            f"--zero3-impl={spec.text!r}: {spec.cls_name} lacks coordinator methods: "
            f"{', '.join(missing)}. See pytest_zero3/protocol.py for what DeepSpeed calls."
        )
    return obj


def apply(spec: Spec) -> None:
    """Install the implementation in this process.  Called in every rank before the scenario runs."""
    if spec.kind == "reference":
        from pytest_zero3.reference_impl import install  # lazy: imports deepspeed

        install()
    elif spec.kind == "class":
        # The class replaces the name parameter_offload constructs (it imported the class by name, so
        # patching the defining module would have no effect), with the reference's fixes around the
        # coordinator, so the contracts judge the class and not DeepSpeed's leaks elsewhere.
        from pytest_zero3.reference_impl import install  # lazy: imports deepspeed

        install(coordinator=load_class(spec))


def identity() -> dict:
    """What this process actually runs: deepspeed version and path, coordinator class, torch, the
    backend and DeepSpeed's accelerator."""
    import torch
    import torch.distributed as dist

    info = {"torch": str(torch.__version__)}
    if dist.is_available() and dist.is_initialized():
        info["backend"] = str(dist.get_backend())
    info.update(accel.describe())
    try:
        import deepspeed
        from deepspeed.runtime.zero import parameter_offload

        cls = parameter_offload.PartitionedParameterCoordinator
        path = os.path.dirname(deepspeed.__file__)
        version = _checkout_version(path) or str(deepspeed.__version__)  # a checkout says 0.0.0 itself
        info.update(deepspeed=version, deepspeed_path=path, coordinator=f"{cls.__module__}.{cls.__qualname__}")
    except Exception as exc:  # reported, not fatal: the header should still print
        info["deepspeed_error"] = f"{type(exc).__name__}: {exc}"
    seen = frameworks_seen()
    if seen:
        info["frameworks"] = seen
    return info


#: The training frameworks whose ZeRO-3 paths the ``fw`` contracts drive (they import deepspeed themselves).
FRAMEWORKS = ("transformers", "accelerate", "peft", "trl")


def frameworks_seen() -> str:
    """The frameworks loaded in this process and the deepspeed they import: the one in ``sys.modules``
    (the implementation's), beside the version installed metadata reports, which transformers and
    accelerate ask before they use deepspeed at all ("" where none is loaded)."""
    import sys
    from importlib import metadata

    loaded = [name for name in FRAMEWORKS if name in sys.modules]
    if not loaded:
        return ""
    versions = ", ".join(f"{name} {getattr(sys.modules[name], '__version__', '?')}" for name in loaded)
    module = sys.modules.get("deepspeed")
    where = os.path.dirname(module.__file__) if module is not None and module.__file__ else "not imported yet"
    try:
        meta = metadata.version("deepspeed")
    except metadata.PackageNotFoundError:
        meta = "none (the frameworks then see no deepspeed)"
    return f"{versions}; they import deepspeed from {where}; installed metadata: {meta}"


def describe_without_import(spec: Spec) -> dict:
    """Header facts found without importing deepspeed: version and the path it will import from."""
    from importlib import metadata

    info = {"spec": spec.text, "impl": spec.label}
    try:
        info["torch"] = metadata.version("torch")
    except metadata.PackageNotFoundError:
        info["torch"] = "not installed"
    if spec.kind == "fork":  # imported from there once the session starts, whatever sys.path says now
        info["deepspeed_path"] = os.path.join(spec.fork_dir or "", "deepspeed")
    else:
        found = importlib.util.find_spec("deepspeed")
        if found is None or not found.origin:
            info["deepspeed"] = "not importable"
            return info
        info["deepspeed_path"] = os.path.dirname(found.origin)
    info["deepspeed"] = _deepspeed_version(info["deepspeed_path"])
    return info


def _deepspeed_version(package_dir: str) -> str:
    """The version of the deepspeed package in ``package_dir``, read from its files, not imported."""
    checkout = _checkout_version(package_dir)
    if checkout:
        return checkout
    try:
        with open(os.path.join(package_dir, "git_version_info_installed.py")) as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return "unknown"
    for node in tree.body:  # the module's ``version = "X.Y.Z"``
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "version" for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    return "unknown"


def _checkout_version(package_dir: str) -> str | None:
    """``version.txt`` of the DeepSpeed source checkout ``package_dir`` lies in, plus its git commit; or None.

    A checkout is not built, so deepspeed itself reports 0.0.0 there.
    """
    root = os.path.dirname(package_dir)
    try:
        with open(os.path.join(root, "version.txt")) as fh:
            version = fh.read().strip()
    except OSError:
        return None
    commit = _git_commit(root)
    return f"{version} (git {commit})" if commit else version


def _git_commit(root: str) -> str | None:
    """The commit checked out in ``root``, read from ``.git`` without running git (12 hex digits)."""
    git = os.path.join(root, ".git")
    try:
        if os.path.isfile(git):  # a worktree or submodule: "gitdir: PATH"
            with open(git) as fh:
                git = os.path.join(root, fh.read().split(":", 1)[1].strip())
        with open(os.path.join(git, "HEAD")) as fh:
            head = fh.read().strip()
        if not head.startswith("ref:"):
            return head[:12]
        ref = head[4:].strip()
        for base in (git, _common_dir(git)):
            try:
                with open(os.path.join(base, ref)) as fh:
                    return fh.read().strip()[:12]
            except OSError:
                pass
            try:
                with open(os.path.join(base, "packed-refs")) as fh:
                    for line in fh:
                        if line.rstrip().endswith(" " + ref):
                            return line.split()[0][:12]
            except OSError:
                pass
    except (OSError, IndexError):
        return None
    return None


def _common_dir(git: str) -> str:
    try:
        with open(os.path.join(git, "commondir")) as fh:
            return os.path.join(git, fh.read().strip())
    except OSError:
        return git
