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

import dataclasses
import importlib
import importlib.util
import os
import sys
from typing import Optional

from pytest_zero3 import protocol

SPEC_ENV = "PYTEST_ZERO3_SPEC"


class SpecError(Exception):
    """A ``--zero3-impl`` value that cannot work; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class Spec:
    text: str
    kind: str  # "installed" | "reference" | "fork" | "class"
    fork_dir: Optional[str] = None
    module: Optional[str] = None  # importable module name, or a .py file path
    cls_name: Optional[str] = None

    @property
    def label(self) -> str:
        return {"installed": "installed deepspeed", "reference": "reference coordinator",
                "fork": f"deepspeed fork at {self.fork_dir}",
                "class": f"coordinator class {self.module}:{self.cls_name}"}[self.kind]


def parse(text: str) -> Spec:
    """Turn the option value into a :class:`Spec`, checking only what needs no import."""
    text = (text or "installed").strip()
    if text in ("installed", "reference"):
        return Spec(text, text)
    if ":" in text and not os.path.isdir(text):
        module, _, cls_name = text.rpartition(":")
        if not module or not cls_name.isidentifier():
            raise SpecError(f"--zero3-impl={text!r}: expected 'module.path:Class' or 'path/to/file.py:Class'.")
        if module.endswith(".py"):
            path = os.path.abspath(module)
            if not os.path.isfile(path):
                raise SpecError(f"--zero3-impl={text!r}: file {module!r} does not exist. "
                                "Give the path of the .py file that defines the coordinator class.")
            module = path
        return Spec(text, "class", module=module, cls_name=cls_name)
    path = os.path.abspath(text)
    if not os.path.exists(path):
        raise SpecError(f"--zero3-impl={text!r}: no such path. Use 'installed', 'reference', a DeepSpeed "
                        "checkout directory, or 'module:Class' / 'file.py:Class'.")
    if not os.path.isdir(path):
        raise SpecError(f"--zero3-impl={text!r} is a file; for a coordinator class write '{text}:ClassName'.")
    if not os.path.isfile(os.path.join(path, "deepspeed", "__init__.py")):
        raise SpecError(f"--zero3-impl={text!r}: directory has no 'deepspeed/__init__.py'. Point it at the root "
                        "of a DeepSpeed checkout (the directory that contains the 'deepspeed' package).")
    return Spec(text, "fork", fork_dir=path)


def prepare_process(spec: Spec) -> None:
    """Make this process (and every process it starts) import deepspeed from the right place.

    Also gives each deepspeed version its own JIT extension directory: DeepSpeed builds its CPU comm
    op there, and two versions sharing torch's default directory load each other's builds.
    """
    os.environ[SPEC_ENV] = spec.text
    if spec.kind == "fork":
        if sys.path[:1] != [spec.fork_dir]:
            sys.path.insert(0, spec.fork_dir)
        old = os.environ.get("PYTHONPATH", "")
        if not old.split(os.pathsep)[:1] == [spec.fork_dir]:
            os.environ["PYTHONPATH"] = spec.fork_dir + (os.pathsep + old if old else "")
    if "TORCH_EXTENSIONS_DIR" not in os.environ:
        import zlib
        info = describe_without_import(spec)
        # torch rebuilds an op whose sources or include paths changed: one directory per package path
        # keeps a fork and the installed package from rebuilding each other's op on every run.
        tag = f"deepspeed-{info.get('deepspeed', 'unknown')}-{zlib.crc32(info.get('deepspeed_path', '').encode()):08x}"
        os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(
            os.path.expanduser("~"), ".cache", "pytest-zero3", "torch_extensions", tag)


def load_class(spec: Spec):
    """Import and return the coordinator class of a ``class`` spec; :class:`SpecError` if it cannot work."""
    try:
        if spec.module.endswith(".py"):
            name = "pytest_zero3_impl_" + os.path.splitext(os.path.basename(spec.module))[0]
            mod = sys.modules.get(name)
            if mod is None:
                loader_spec = importlib.util.spec_from_file_location(name, spec.module)
                mod = importlib.util.module_from_spec(loader_spec)
                sys.modules[name] = mod
                loader_spec.loader.exec_module(mod)
        else:
            mod = importlib.import_module(spec.module)
    except Exception as exc:  # the user's module: any import failure is a usage error
        sys.modules.pop("pytest_zero3_impl_" + os.path.splitext(os.path.basename(spec.module))[0], None)
        raise SpecError(f"--zero3-impl={spec.text!r}: importing {spec.module!r} failed: "
                        f"{type(exc).__name__}: {exc}") from exc
    obj = getattr(mod, spec.cls_name, None)
    if obj is None:
        raise SpecError(f"--zero3-impl={spec.text!r}: {spec.module!r} has no attribute {spec.cls_name!r}.")
    if not isinstance(obj, type):
        raise SpecError(f"--zero3-impl={spec.text!r}: {spec.cls_name!r} is a {type(obj).__name__}, not a class.")
    missing = protocol.missing_methods(obj)
    if missing:
        raise SpecError(f"--zero3-impl={spec.text!r}: {spec.cls_name} lacks coordinator methods: "
                        f"{', '.join(missing)}. See pytest_zero3/protocol.py for what DeepSpeed calls.")
    return obj


def apply(spec: Spec) -> None:
    """Install the implementation in this process.  Called in every rank before the scenario runs."""
    if spec.kind == "reference":
        from pytest_zero3 import reference_impl
        reference_impl.install()
    elif spec.kind == "class":
        # The class replaces the name parameter_offload constructs (it imported the class by name, so
        # patching the defining module would have no effect), with the reference's fixes around the
        # coordinator, so the contracts judge the class and not DeepSpeed's leaks elsewhere.
        from pytest_zero3 import reference_impl
        reference_impl.install(coordinator=load_class(spec))


def identity() -> dict:
    """What this process actually runs: deepspeed version and path, coordinator class, torch."""
    import torch
    import torch.distributed as dist
    info = {"torch": str(torch.__version__)}
    if dist.is_available() and dist.is_initialized():
        info["backend"] = str(dist.get_backend())
    try:
        import deepspeed
        from deepspeed.runtime.zero import parameter_offload
        cls = parameter_offload.PartitionedParameterCoordinator
        info.update(deepspeed=str(deepspeed.__version__), deepspeed_path=os.path.dirname(deepspeed.__file__),
                    coordinator=f"{cls.__module__}.{cls.__qualname__}")
    except Exception as exc:  # reported, not fatal: the header should still print
        info["deepspeed_error"] = f"{type(exc).__name__}: {exc}"
    return info


def describe_without_import(spec: Spec) -> dict:
    """Header facts found without importing deepspeed: version and the path it will import from."""
    from importlib import metadata
    info = {"spec": spec.text, "impl": spec.label}
    try:
        info["torch"] = metadata.version("torch")
    except metadata.PackageNotFoundError:
        info["torch"] = "not installed"
    found = importlib.util.find_spec("deepspeed")
    if found is None or not found.origin:
        info["deepspeed"] = "not importable"
        return info
    info["deepspeed_path"] = os.path.dirname(found.origin)
    info["deepspeed"] = _deepspeed_version(info["deepspeed_path"])
    return info


def _deepspeed_version(package_dir: str) -> str:
    """The version of the deepspeed package in ``package_dir``, read from its files, not imported."""
    import re
    installed = os.path.join(package_dir, "git_version_info_installed.py")
    if os.path.isfile(installed):
        match = re.search(r"^version\s*=\s*['\"]([^'\"]+)", open(installed).read(), re.M)
        if match:
            return match.group(1)
    version_txt = os.path.join(os.path.dirname(package_dir), "version.txt")
    if os.path.isfile(version_txt):
        return open(version_txt).read().strip()
    return "unknown"
