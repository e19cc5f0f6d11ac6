"""Which classes are the author's and which are generated from them, and the hook by which pytorch's
``instantiate_device_type_tests`` generates the library's dimensions (``parametrize_fn``)."""

from __future__ import annotations

from typing import Any

__all__ = ["with_dims", "author_class"]

_PACKAGE = __name__.rsplit(".", 2)[0] + "."  # this library's modules (also when vendored under another name)


def _parametrize_fn(test: Any, generic_cls: Any, device_cls: Any) -> Any:
    """pytorch's ``parametrize_fn`` protocol: the library's dimensions, then the author's parametrizations."""
    from .variants import composed, dims_parametrize_fn

    return composed(dims_parametrize_fn, test.__dict__.get("_tst_user_parametrize_fn"))(test, generic_cls, device_cls)


def with_dims(fn: Any) -> Any:
    """*fn* (wrapped by :func:`ends_on_rejection`) with the load-mode and engine dimensions as a
    ``parametrize_fn``, so pytorch's ``instantiate_device_type_tests`` generates them too."""
    if "_tst_user_parametrize_fn" not in fn.__dict__:
        fn._tst_user_parametrize_fn = getattr(fn, "parametrize_fn", None)
        fn.parametrize_fn = _parametrize_fn
    return fn


def _instantiated(klass: type) -> bool:
    """A class generated from the author's (by this library, or pytorch's ``(CPUTestBase, TestFoo)``)."""
    if "_tst_generic" in vars(klass):
        return True
    bases = klass.__bases__
    return len(bases) > 1 and f"{bases[0].__module__}.".startswith("torch.testing._internal.")


def author_class(cls: type, attribute: str) -> str:
    """The name of the author's class that declares *attribute* (or, undeclared, the author's nearest
    class): never a generated ``TestFooCPU``, whose fix would not go where the author can paste it."""
    framework = ("unittest.", "expecttest.", "torch.testing._internal.")
    authors = [
        k
        for k in cls.__mro__
        if not _instantiated(k)
        and not f"{k.__module__}.".startswith(framework)
        and not f"{k.__module__}.".startswith(_PACKAGE)
        and k is not object
    ]
    return next((k for k in authors if attribute in vars(k)), authors[0] if authors else cls).__name__
