"""Module attributes that import on first use (PEP 562), so a light ``import`` stays light."""
from importlib import import_module


def lazy_getattr(module_name: str, table: dict, namespace: dict):
    """A module ``__getattr__`` serving ``table`` ({name: (module, attribute or None)}): the first
    access imports the module and keeps the value in ``namespace`` (the module's globals), so
    later accesses are plain lookups."""
    def __getattr__(name):
        if name not in table:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        source, attr = table[name]
        module = import_module(source)
        value = module if attr is None else getattr(module, attr)
        namespace[name] = value
        return value

    return __getattr__
