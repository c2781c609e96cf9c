"""DynamoDB condition and update expressions: the subset this system writes, parsed honestly.

Supported: condition/filter expressions with ``AND``/``OR``/``NOT``, parentheses, ``=``, ``<>``,
``<``, ``<=``, ``>``, ``>=``, ``BETWEEN``, ``IN``, ``attribute_exists``, ``attribute_not_exists``
and ``begins_with``; update expressions with ``SET`` (``=``, ``+``, ``-``, ``if_not_exists``,
``list_append``), ``REMOVE`` and ``ADD`` (numbers and sets); document paths of names joined by
dots. Anything else — ``size``, ``contains``, list indexes, ``DELETE`` — raises
:class:`UnsupportedExpression` rather than being ignored.

The DynamoDB rules our code depends on are kept: values compare as
:mod:`lightmetrics.harness.testing.memory.dynamo_values` says; every ``#name``/``:value`` must be defined and
every one given must be used (DynamoDB answers ``ValidationException`` for both); right-hand sides
read the item as it was before the update; two actions on overlapping paths are refused; the key is
read-only.

Example:
    >>> cond = parse_condition("attribute_not_exists(pk) OR #v < :v")
    >>> cond.evaluate({"pk": "a", "v": Decimal(1)}, Bindings({"#v": "v"}, {":v": Decimal(2)}))
    True
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal  # noqa: F401 - the doctest's
from functools import lru_cache
from typing import Any

from lightmetrics.harness.testing.memory.dynamo_values import COMPARE, MISSING, dynamo_type, equal, ordered, sort_key


class UnsupportedExpression(Exception):
    """An expression form this in-memory table does not implement (never silently ignored)."""


class ExpressionInvalid(Exception):
    """What DynamoDB answers ``ValidationException`` to (the message is DynamoDB's, shortened)."""


_TOKEN = re.compile(r"\s*(?:(?P<name>#[A-Za-z0-9_]+)|(?P<value>:[A-Za-z0-9_]+)|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<num>\d+)"
                    r"|(?P<op><>|<=|>=|[=<>(),.+\-\[\]]))")
_KEYWORDS = {"AND", "OR", "NOT", "BETWEEN", "IN", "SET", "REMOVE", "ADD", "DELETE"}


@lru_cache(maxsize=1024)
def _tokens(text: str) -> tuple[str, ...]:
    """The tokens of ``text`` (an expression's text is code, few distinct: each is read once)."""
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ExpressionInvalid(f"Invalid expression: syntax error near {text[pos:pos + 20]!r}")
        out.append(m.group(m.lastgroup or "op"))
        pos = m.end()
    return tuple(out)


@lru_cache(maxsize=1024)
def _placeholders(expressions: tuple[str | None, ...]) -> tuple[frozenset[str], frozenset[str]]:
    """The ``#names`` and ``:values`` the expressions use."""
    toks = [t for e in expressions if e for t in _tokens(e)]
    return frozenset(t for t in toks if t.startswith("#")), frozenset(t for t in toks if t.startswith(":"))


@dataclass
class Bindings:
    """``ExpressionAttributeNames``/``Values`` of one request."""

    names: dict[str, str]
    values: dict[str, Any]

    def name(self, token: str) -> str:
        return self.names[token]

    def value(self, token: str) -> Any:
        return self.values[token]

    def check(self, *expressions: str | None) -> None:
        """DynamoDB's rules for one request's expressions: every ``#name``/``:value`` they use is
        defined, and every one given is used (``ValidationException`` otherwise)."""
        names, values = _placeholders(expressions)
        for t in sorted(names - set(self.names)):
            raise ExpressionInvalid(f"An expression attribute name used in the document path is not defined; "
                                    f"attribute name: {t}")
        for t in sorted(values - set(self.values)):
            raise ExpressionInvalid(f"An expression attribute value used in expression is not defined; "
                                    f"attribute value: {t}")
        if set(self.names) - names:
            raise ExpressionInvalid(f"Value provided in ExpressionAttributeNames unused in expressions: "
                                    f"keys: {{{', '.join(sorted(set(self.names) - names))}}}")
        if set(self.values) - values:
            raise ExpressionInvalid(f"Value provided in ExpressionAttributeValues unused in expressions: "
                                    f"keys: {{{', '.join(sorted(set(self.values) - values))}}}")


# -- the AST -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Path:
    parts: tuple[str, ...]  # tokens: "#x" or a bare name

    def resolve(self, b: Bindings) -> tuple[str, ...]:
        return tuple(b.name(p) if p.startswith("#") else p for p in self.parts)

    def get(self, item: dict[str, Any], b: Bindings) -> Any:
        node: Any = item
        for part in self.resolve(b):
            if not isinstance(node, dict) or part not in node:
                return MISSING
            node = node[part]
        return node


@dataclass(frozen=True)
class Value:
    token: str

    def get(self, item: dict[str, Any], b: Bindings) -> Any:
        return b.value(self.token)


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple[Any, ...]

    def get(self, item: dict[str, Any], b: Bindings) -> Any:
        vals = [a.get(item, b) for a in self.args]
        if self.fn == "if_not_exists":
            return vals[1] if vals[0] is MISSING else vals[0]
        if self.fn == "list_append":
            if any(v is MISSING or not isinstance(v, list) for v in vals):
                raise ExpressionInvalid("An operand in the update expression has an incorrect data type")
            return [*vals[0], *vals[1]]
        if self.fn in ("+", "-"):
            if any(v is MISSING for v in vals):
                raise ExpressionInvalid("The provided expression refers to an attribute that does not exist in the item")
            if any(dynamo_type(v) != "N" for v in vals):
                raise ExpressionInvalid("An operand in the update expression has an incorrect data type")
            return vals[0] + vals[1] if self.fn == "+" else vals[0] - vals[1]
        raise UnsupportedExpression(f"function {self.fn}")


@dataclass(frozen=True)
class Condition:
    op: str
    args: tuple[Any, ...]

    def evaluate(self, item: dict[str, Any], b: Bindings) -> bool:
        a = self.args
        if self.op == "AND":
            return all(x.evaluate(item, b) for x in a)
        if self.op == "OR":
            return any(x.evaluate(item, b) for x in a)
        if self.op == "NOT":
            return not a[0].evaluate(item, b)
        if self.op == "attribute_exists":
            return a[0].get(item, b) is not MISSING
        if self.op == "attribute_not_exists":
            return a[0].get(item, b) is MISSING
        vals = [x.get(item, b) for x in a]
        if self.op == "begins_with":
            return ordered(vals[0], vals[1]) and dynamo_type(vals[0]) in ("S", "B") \
                and sort_key(vals[0]).startswith(sort_key(vals[1]))
        if self.op == "BETWEEN":
            return ordered(vals[0], vals[1]) and ordered(vals[0], vals[2]) \
                and sort_key(vals[1]) <= sort_key(vals[0]) <= sort_key(vals[2])
        if self.op == "IN":
            return any(equal(vals[0], v) for v in vals[1:])
        return COMPARE[self.op](vals[0], vals[1])


# -- the parser --------------------------------------------------------------------------------------
class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0

    def peek(self, upper: bool = True) -> str | None:
        if self.i >= len(self.toks):
            return None
        t = self.toks[self.i]
        return t.upper() if upper and t.upper() in _KEYWORDS else t

    def take(self, expected: str | None = None) -> str:
        t = self.peek()
        if t is None or (expected is not None and t != expected):
            raise ExpressionInvalid(f"Invalid expression: expected {expected or 'a token'}, found {t}")
        self.i += 1
        return t

    def done(self) -> None:
        if self.peek() is not None:
            raise ExpressionInvalid(f"Invalid expression: unexpected {self.peek()!r}")

    # conditions
    def condition(self) -> Condition:
        parts = [self.conjunction()]
        while self.peek() == "OR":
            self.take()
            parts.append(self.conjunction())
        return parts[0] if len(parts) == 1 else Condition("OR", tuple(parts))

    def conjunction(self) -> Condition:
        parts = [self.negation()]
        while self.peek() == "AND":
            self.take()
            parts.append(self.negation())
        return parts[0] if len(parts) == 1 else Condition("AND", tuple(parts))

    def negation(self) -> Condition:
        if self.peek() == "NOT":
            self.take()
            return Condition("NOT", (self.negation(),))
        if self.peek() == "(":
            self.take()
            inner = self.condition()
            self.take(")")
            return inner
        t = self.peek(upper=False)
        if t in ("attribute_exists", "attribute_not_exists", "begins_with"):
            self.take()
            args = self.arguments()
            want = 2 if t == "begins_with" else 1
            if len(args) != want or not isinstance(args[0], Path):
                raise ExpressionInvalid(f"Invalid function call: {t} takes a path{' and an operand' if want == 2 else ''}")
            return Condition(t, tuple(args))
        if t is not None and self.i + 1 < len(self.toks) and self.toks[self.i + 1] == "(":
            raise UnsupportedExpression(f"function {t}")
        left = self.operand()
        op = self.take()
        if op == "BETWEEN":
            low = self.operand()
            self.take("AND")
            return Condition("BETWEEN", (left, low, self.operand()))
        if op == "IN":
            return Condition("IN", (left, *self.arguments()))
        if op not in COMPARE:
            raise ExpressionInvalid(f"Invalid expression: {op!r} is not a comparator")
        return Condition(op, (left, self.operand()))

    def arguments(self) -> list[Any]:
        self.take("(")
        args = [self.operand()]
        while self.peek() == ",":
            self.take()
            args.append(self.operand())
        self.take(")")
        return args

    def operand(self) -> Any:
        t = self.peek(upper=False)
        if t is None:
            raise ExpressionInvalid("Invalid expression: an operand is missing")
        if t.startswith(":"):
            self.take()
            return Value(t)
        if t in ("if_not_exists", "list_append"):
            self.take()
            args = self.arguments()
            if len(args) != 2 or (t == "if_not_exists" and not isinstance(args[0], Path)):
                raise ExpressionInvalid(f"Invalid function call: {t}")
            return Call(t, tuple(args))
        if self.i + 1 < len(self.toks) and self.toks[self.i + 1] == "(":
            raise UnsupportedExpression(f"function {t}")
        return self.path()

    def path(self) -> Path:
        t = self.take()
        if not (t.startswith("#") or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", t)) or t.upper() in _KEYWORDS:
            raise ExpressionInvalid(f"Invalid expression: {t!r} is not an attribute path")
        parts = [t]
        while self.peek() in (".", "["):
            if self.take() == "[":
                raise UnsupportedExpression("list indexes in document paths")
            parts.append(self.take())
        return Path(tuple(parts))


@lru_cache(maxsize=1024)
def parse_condition(text: str) -> Condition:
    """The parsed condition (immutable: parsed once per text)."""
    p = _Parser(text)
    cond = p.condition()
    p.done()
    return cond


@dataclass(frozen=True)
class Update:
    """A parsed update expression: ``(path, value-expression)`` per SET, paths to REMOVE, ADDs."""

    sets: tuple[tuple[Path, Any], ...]
    removes: tuple[Path, ...]
    adds: tuple[tuple[Path, Value], ...]

    def apply(self, item: dict[str, Any], b: Bindings, key_names: tuple[str, ...]) -> dict[str, Any]:
        """The item after the update (a new dict; right-hand sides read ``item`` as it was)."""
        paths = [p.resolve(b) for p, _ in self.sets] + [p.resolve(b) for p in self.removes] \
            + [p.resolve(b) for p, _ in self.adds]
        for i, a in enumerate(paths):
            if a[0] in key_names:
                raise ExpressionInvalid(f"Cannot update attribute {a[0]}. This attribute is part of the key")
            for other in paths[i + 1:]:
                if a[:len(other)] == other[:len(a)]:
                    raise ExpressionInvalid(f"Two document paths overlap with each other: {list(a)}, {list(other)}")
        writes = [(p.resolve(b), v.get(item, b)) for p, v in self.sets]
        for p, v in self.adds:
            path, add, old = p.resolve(b), v.get(item, b), p.get(item, b)
            writes.append((path, _added(old, add)))
        new: dict[str, Any] = deep_copy(item)
        for path, value in writes:
            _parent(new, path)[path[-1]] = value
        for path in (p.resolve(b) for p in self.removes):
            parent = _parent(new, path, removing=True)
            if parent is not None:
                parent.pop(path[-1], None)
        return new


def _added(old: Any, add: Any) -> Any:
    t = dynamo_type(add)
    if old is MISSING:
        if t == "N" or t in ("SS", "NS", "BS"):
            return add
    elif t == "N" and dynamo_type(old) == "N":
        return old + add
    elif t in ("SS", "NS", "BS") and dynamo_type(old) == t:
        return old | add
    raise ExpressionInvalid("An operand in the update expression has an incorrect data type")


def deep_copy(v: Any) -> Any:
    """A copy of a stored value (maps, lists and sets copied; the rest is immutable)."""
    if isinstance(v, dict):
        return {k: deep_copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [deep_copy(x) for x in v]
    if isinstance(v, set):
        return set(v)
    return v


def _parent(item: dict[str, Any], path: tuple[str, ...], *, removing: bool = False) -> Any:
    node: Any = item
    for part in path[:-1]:
        if not isinstance(node, dict) or part not in node:
            if removing:
                return None
            raise ExpressionInvalid("The document path provided in the update expression is invalid for update")
        node = node[part]
    if not isinstance(node, dict):
        raise ExpressionInvalid("The document path provided in the update expression is invalid for update")
    return node


@lru_cache(maxsize=1024)
def parse_update(text: str) -> Update:
    """The parsed update (immutable: parsed once per text)."""
    p = _Parser(text)
    sets: list[tuple[Path, Any]] = []
    removes: list[Path] = []
    adds: list[tuple[Path, Value]] = []
    seen: set[str] = set()
    while p.peek() is not None:
        clause = p.take()
        if clause == "DELETE":
            raise UnsupportedExpression("the DELETE clause")
        if clause not in ("SET", "REMOVE", "ADD") or clause in seen:
            raise ExpressionInvalid(f"Invalid UpdateExpression: unexpected {clause!r}")
        seen.add(clause)
        while True:
            path = p.path()
            if clause == "SET":
                p.take("=")
                value = p.operand()
                if p.peek() in ("+", "-"):
                    value = Call(p.take(), (value, p.operand()))
                sets.append((path, value))
            elif clause == "REMOVE":
                removes.append(path)
            else:
                operand = p.operand()
                if not isinstance(operand, Value):
                    raise ExpressionInvalid("Invalid UpdateExpression: ADD takes a value")
                adds.append((path, operand))
            if p.peek() != ",":
                break
            p.take()
    if not seen:
        raise ExpressionInvalid("Invalid UpdateExpression: the expression is empty")
    return Update(tuple(sets), tuple(removes), tuple(adds))
