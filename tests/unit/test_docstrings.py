"""Every public function and class of the package carries a docstring (the API's contract)."""
import importlib
import inspect
import pkgutil

import hetsync

# Keras hook overrides document themselves through the class docstring.
_HOOKS = ("on_", "set_model", "set_params", "get_config", "from_config")


def _modules():
    yield hetsync
    for info in pkgutil.walk_packages(hetsync.__path__, "hetsync."):
        if info.name.endswith("__main__") or "._" in info.name:
            continue
        yield importlib.import_module(info.name)


def test_public_api_has_docstrings():
    missing = []
    for mod in _modules():
        if not (mod.__doc__ or "").strip():
            missing.append(mod.__name__)
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if not (obj.__doc__ or "").strip():
                missing.append(f"{mod.__name__}.{name}")
            if inspect.isclass(obj) and obj.__module__ == mod.__name__:
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or attr.startswith(_HOOKS):
                        continue
                    fn = member.fget if isinstance(member, property) else member
                    # an override may inherit its documentation from the base class
                    if inspect.isfunction(fn) and not (inspect.getdoc(getattr(obj, attr)) or "").strip():
                        missing.append(f"{mod.__name__}.{name}.{attr}")
    assert not missing, "public names without a docstring: " + ", ".join(sorted(set(missing)))
