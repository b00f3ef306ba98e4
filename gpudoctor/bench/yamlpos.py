"""YAML with line numbers: load a document and remember where every mapping key and sequence item was written."""

from __future__ import annotations

from gpudoctor.errors import ConfigError


class Located:
    """A loaded YAML value plus `lines`: {path tuple: 1-based line}, so validation errors can say FILE:LINE."""

    def __init__(self, data, lines: dict[tuple, int], path: str):
        self.data, self.lines, self.path = data, lines, path

    def line(self, *where) -> int | None:
        """The line of the deepest known prefix of `where` (a key that is missing points at its parent)."""
        where = tuple(where)
        while where:
            if where in self.lines:
                return self.lines[where]
            where = where[:-1]
        return self.lines.get((), 1)

    def error(self, message: str, *where) -> ConfigError:
        return ConfigError(message, path=self.path, line=self.line(*where))


def load(text: str, path: str) -> Located:
    """Parse one YAML document; syntax errors and duplicate keys become ConfigError with the line."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise ConfigError(f"not valid YAML: {exc.problem or exc}", path=path,
                          line=(mark.line + 1) if mark else None) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}", path=path) from None
    lines: dict[tuple, int] = {}
    if node is None:
        return Located(None, lines, path)
    lines[()] = node.start_mark.line + 1
    constructor = yaml.SafeLoader("")

    def build(n, where: tuple):
        if isinstance(n, yaml.MappingNode):
            out = {}
            for k, v in n.value:
                key = constructor.construct_object(k, deep=True)
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    raise ConfigError("mapping keys must be scalars", path=path, line=k.start_mark.line + 1)
                if key in out:
                    raise ConfigError(f"duplicate key {key!r}", path=path, line=k.start_mark.line + 1)
                lines[where + (key,)] = k.start_mark.line + 1
                out[key] = build(v, where + (key,))
            return out
        if isinstance(n, yaml.SequenceNode):
            out = []
            for i, item in enumerate(n.value):
                lines[where + (i,)] = item.start_mark.line + 1
                out.append(build(item, where + (i,)))
            return out
        try:
            return constructor.construct_object(n, deep=True)
        except yaml.YAMLError as exc:
            raise ConfigError(f"bad value: {exc}", path=path, line=n.start_mark.line + 1) from None

    return Located(build(node, ()), lines, path)
