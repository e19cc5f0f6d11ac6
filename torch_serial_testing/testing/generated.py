"""Which classes are the author's and which are generated from them, and the hook by which pytorch's
``instantiate_device_type_tests`` generates the library's dimensions (``parametrize_fn``)."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterable, Iterator

__all__ = ["with_dims", "author_class", "resolvable"]

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


@contextlib.contextmanager
def resolvable(cls: type, declared: Iterable[Any]) -> Iterator[None]:
    """While the class statement of *cls* runs, its module does not hold it yet: a declared helper class
    nested in it (pytorch's ``TestLRScheduler.SchedulerTestNet``) would not resolve under its pickled
    name ``module.TestX.Net``, and the trust policy would refuse it.  Bind *cls* under its name for the
    judging only (the class statement binds it right after), and only when it declares such a class."""
    module = sys.modules.get(cls.__module__)
    prefix = f"{cls.__qualname__}."
    nested = not isinstance(declared, (str, bytes)) and any(
        isinstance(item, type) and item.__module__ == cls.__module__ and item.__qualname__.startswith(prefix)
        for item in (declared if hasattr(declared, "__iter__") else ())
    )
    if module is None or not nested or "." in cls.__qualname__ or cls.__name__ in vars(module):
        yield
        return
    setattr(module, cls.__name__, cls)
    try:
        yield
    finally:
        if vars(module).get(cls.__name__) is cls:
            delattr(module, cls.__name__)


def keep_reachable(generic_cls: Any) -> None:
    """Under pytorch's ``instantiate_device_type_tests``, which removes the generic class from its module:
    put it back when it holds nested classes, which pickle as ``getattr(TestFoo, 'Net')`` and so need
    ``module.TestFoo``.  pytorch strips the generic tests off the class, so nothing collects it -- unless
    it inherits tests from a base, which would then run generic: left removed then."""
    module = sys.modules.get(getattr(generic_cls, "__module__", ""))
    if module is None or not isinstance(generic_cls, type) or "." in generic_cls.__qualname__:
        return
    if generic_cls.__name__ in vars(module):
        return
    prefix = f"{generic_cls.__qualname__}."
    nested = any(isinstance(v, type) and v.__qualname__.startswith(prefix) for v in vars(generic_cls).values())
    inherited = any(
        n.startswith("test") and callable(v)
        for base in generic_cls.__mro__[1:]
        if not f"{base.__module__}.".startswith(("unittest.", "expecttest.", "torch.testing._internal.", _PACKAGE))
        for n, v in vars(base).items()
    )
    if nested and not inherited:
        setattr(module, generic_cls.__name__, generic_cls)
