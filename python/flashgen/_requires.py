"""The optional dependencies: what a part of the package needs that is not
installed is said in one way everywhere, with the command that installs it."""
import importlib

# module -> the name people know it by
_NAMES = {"torch": "PyTorch", "transformers": "transformers"}


def missing(what, *modules):
    """The error for `what` (such as "flashgen.attention") without modules."""
    names = " and ".join(_NAMES.get(m, m) for m in modules)
    error = ModuleNotFoundError(f"{what} needs {names} (pip install {' '.join(modules)})")
    error.name = modules[0]
    return error


def require(module, what, *also):
    """module, imported; where it is not installed, the error that `what`
    needs it (and the modules also, which it needs as well)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module and not module.startswith(f"{e.name}."):
            raise  # the module is there and lacks something of its own
        raise missing(what, module, *also) from None
