"""The one loader for the YAML files gpudoctor reads (inventory, campaigns): plain data only, every node located.

    compose(text, path, error=ConfigError) -> yaml.Node | None   checked node tree (the inventory walks it)
    load(text, path, error=ConfigError) -> Located               data + {path tuple: line} (campaigns)
    load_file(path, what=..., error=...) -> (Located, text)      through gpudoctor.files.inputs (regular file, size cap, UTF-8)
    scalar(node)                                                 a checked scalar node's value

Refused, each as one `FILE:LINE: ...` error: YAML syntax errors (an unclosed quote or bracket points where it was
opened), tags other than the plain ones (`!ip`, `!!python/...`, `!!binary`, `!!set`, ...), merge keys (`<<`),
non-scalar keys, nesting deeper than MAX_DEPTH, aliases that expand past MAX_NODES (or refer to themselves),
NUL characters in strings. Anchors and aliases themselves are fine. Dates stay the strings they were written as.
"""

from __future__ import annotations

from gpudoctor.errors import ConfigError
from gpudoctor.files.inputs import MiB, brief, decode, read_bytes

MAX_DEPTH = 64
MAX_NODES = 100_000
MAX_BYTES = 4 * MiB
MAX_INT_CHARS = 100  # no number gpudoctor reads needs more; Python refuses int() past 4300 digits (#40)
_STD = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_STD + t for t in ("str", "int", "float", "bool", "null", "timestamp", "value")}
_MAP, _SEQ, _MERGE = _STD + "map", _STD + "seq", _STD + "merge"


class Located:
    """A loaded YAML value plus `lines`: {path tuple: 1-based line}, so validation errors can say FILE:LINE."""

    def __init__(self, data, lines: dict[tuple, int], path: str, error=ConfigError):
        self.data, self.lines, self.path, self._error = data, lines, path, error

    def line(self, *where) -> int | None:
        """The line of the deepest known prefix of `where` (a key that is missing points at its parent)."""
        where = tuple(where)
        while where:
            if where in self.lines:
                return self.lines[where]
            where = where[:-1]
        return self.lines.get((), 1)

    def error(self, message: str, *where):
        return self._error(message, path=self.path, line=self.line(*where))


def _syntax_error(exc, path: str, error):
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        what = ", ".join(" ".join(str(x).split()) for x in (exc.context, exc.problem) if x) or "malformed YAML"
        opened = str(exc.context or "").startswith(("while parsing a flow", "while scanning a quoted"))
        unclosed = "end of stream" in str(exc.problem) or "<stream end>" in str(exc.problem)
        if exc.context_mark and (opened or unclosed) and exc.context_mark.line != mark.line:
            # an unclosed quote or bracket: point where it was opened (the parser notices only later)
            what += f" (noticed at line {mark.line + 1})" if exc.problem_mark else ""
            mark = exc.context_mark
        return error(f"YAML syntax error: {what}", path=path, line=mark.line + 1 if mark else None)
    return error(f"YAML error: {' '.join(str(exc).split())}", path=path)


def _check_depth(text: str, path: str, error) -> None:
    """Nesting deeper than MAX_DEPTH is refused from the event stream (PyYAML's composer would recurse)."""
    import yaml

    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise error(f"YAML nests deeper than {MAX_DEPTH} levels", path=path, line=event.start_mark.line + 1)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _tag_name(tag: str) -> str:
    return "!!" + tag[len(_STD):] if tag.startswith(_STD) else tag


def _check_plain(root, path: str, error) -> None:
    """Every node is a plain mapping, list or scalar; the tree (aliases expanded) has at most MAX_NODES nodes."""
    import yaml

    sizes: dict[int, int] = {}
    busy: set[int] = set()

    def err(node, msg):
        return error(msg, path=path, line=node.start_mark.line + 1)

    def size(node) -> int:
        nid = id(node)
        if nid in sizes:
            return sizes[nid]
        if nid in busy:
            raise err(node, "a YAML alias refers to the node that contains it")
        busy.add(nid)
        total = 1
        if isinstance(node, yaml.ScalarNode):
            if node.tag not in _SCALAR_TAGS:
                raise err(node, f"YAML tag {brief(_tag_name(node.tag), 40)} is not plain data (gpudoctor reads "
                                f"mappings, lists, strings, numbers, booleans and null)")
            if "\0" in node.value:
                raise err(node, "a string contains a NUL character")
            if node.tag == _STD + "int" and len(node.value) > MAX_INT_CHARS:  # int() refuses past 4300 digits
                raise err(node, f"an integer of {len(node.value)} characters (gpudoctor reads at most "
                                f"{MAX_INT_CHARS})")
        elif isinstance(node, yaml.SequenceNode):
            if node.tag != _SEQ:
                raise err(node, f"YAML tag {brief(_tag_name(node.tag), 40)} is not plain data (a list is written "
                                f"without a tag)")
            total += sum(size(n) for n in node.value)
        elif isinstance(node, yaml.MappingNode):
            if node.tag != _MAP:
                raise err(node, f"YAML tag {brief(_tag_name(node.tag), 40)} is not plain data (a mapping is written "
                                f"without a tag)")
            for k, v in node.value:
                if k.tag == _MERGE:
                    raise err(k, "YAML merge keys (<<) are not supported: write the keys out (an inventory can put "
                                 "shared SSH settings under defaults:)")
                if not isinstance(k, yaml.ScalarNode):
                    raise err(k, "mapping keys must be plain scalars, not a mapping or a list")
                total += size(k) + size(v)
        if total > MAX_NODES:
            raise err(node, f"YAML expands to more than {MAX_NODES} values (aliases of aliases?)")
        busy.discard(nid)
        sizes[nid] = total
        return total

    size(root)


def compose(text: str, path: str, *, error=ConfigError):
    """The document's root node (None when empty), refused as one located error unless it is plain YAML data."""
    import yaml

    try:
        _check_depth(text, path, error)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise _syntax_error(exc, path, error) from None
    if root is not None:
        _check_plain(root, path, error)
    return root


_constructor = None


def scalar(node):
    """The value of a checked scalar node: str, int, float, bool or None (a date stays the string written)."""
    global _constructor
    if node.tag in (_STD + "str", _STD + "timestamp", _STD + "value"):
        return node.value
    if _constructor is None:
        import yaml

        _constructor = yaml.SafeLoader("")
    return _constructor.construct_object(node, deep=True)


def load(text: str, path: str, *, error=ConfigError) -> Located:
    """Parse one YAML document into plain data with the line of every key and item; duplicate keys refused."""
    import yaml

    root = compose(text, path, error=error)
    lines: dict[tuple, int] = {}
    if root is None:
        return Located(None, lines, path, error)
    lines[()] = root.start_mark.line + 1

    def build(n, where: tuple):
        if isinstance(n, yaml.MappingNode):
            out = {}
            for k, v in n.value:
                key = scalar(k)
                if key in out:
                    raise error(f"duplicate key {brief(key, 60)} (first at line {lines[where + (key,)]})", path=path,
                                line=k.start_mark.line + 1)
                lines[where + (key,)] = k.start_mark.line + 1
                out[key] = build(v, where + (key,))
            return out
        if isinstance(n, yaml.SequenceNode):
            out = []
            for i, item in enumerate(n.value):
                lines[where + (i,)] = item.start_mark.line + 1
                out.append(build(item, where + (i,)))
            return out
        return scalar(n)

    return Located(build(root, ()), lines, path, error)


def load_file(path, *, what: str = "YAML file", error=ConfigError, max_bytes: int = MAX_BYTES,
              obeyed: bool = False) -> tuple[Located, str]:
    """Read (gpudoctor.files.inputs: a regular file, at most max_bytes, UTF-8; `obeyed`: as root, root's by the one
    rule, judged on the fd read) and load one YAML file."""
    import os

    p = os.fspath(path)
    text = decode(read_bytes(p, what=what, max_bytes=max_bytes, error=error, obeyed=obeyed), p, what=what,
                  error=error)
    return load(text, p, error=error), text
