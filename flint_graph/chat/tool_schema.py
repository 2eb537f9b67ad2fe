"""Typing tool-call arguments by the JSON Schema a tool declares (glm47-format.md, requirement 5).

GLM-4.7 writes a string argument verbatim and every other value as JSON, so the parser gets
text and must work out which value it was. The schema decides, read as a whole: `type` (a name
or a list), `enum`, `const`, `allOf`, `anyOf`, `oneOf` and local `$ref`s ("#/$defs/X",
"#/definitions/X", any "#/..." pointer into the tool's `parameters`), at the argument and in
the `properties` reached through the root's own `$ref`/`allOf`/`anyOf`/`oneOf`. `oneOf` is read
as `anyOf` (a value matching two branches is no reason to refuse it). Keywords that constrain
a value without deciding its JSON type (minimum, pattern, items, properties, ...) and remote
`$ref`s are not checked: the tool validates its own input. A reference cycle is cut at a
fixed depth and counts as "anything". The declaration itself is checked when the tools arrive
(`tool_schemas`): a parameters schema that is not an object schema, a keyword whose value JSON
Schema does not allow (`required`, `properties`, `enum`, the combinators, `multipleOf`,
`minimum`, `maxLength`, ...) or a local `$ref` to nothing is refused, naming its path.

`type_argument(text, schema, root)` picks, in this order, the first reading the schema admits:
  1. None, for the text `null` (blanks around it ignored);
  2. the stripped text JSON-decoded, when that gives a non-string: so a parameter that is a
     string or a number (boolean, array, object) reads `7` as 7 and `[1, 2]` as a list, as
     SGLang's, llama.cpp's and Ollama's GLM-4.x parsers do;
  3. the text verbatim, as a string (so a string-only parameter keeps "2", "true", " x " as
     written);
  4. True / False for the Python spellings `True` / `False`;
  5. one repair step, reported in the note: a quoted number or boolean (`"42"` -> 42) and a
     backslash-escaped or JSON-quoted array/object (`[{\\"id\\": 1}]` -> [{"id": 1}]).
Nothing admitted: the text is kept verbatim as a string and the note says it does not fit. A
parameter without a schema, or whose schema says nothing about types, is JSON-decoded when
that works and kept as text otherwise. So a schema that admits only strings always yields the
verbatim text: `only_strings` tells the parser such a value can be streamed as it arrives.

Parameters whose root is a choice of object schemas (`anyOf` / `oneOf` at the root, also
reached through the root's `$ref` or `allOf`), told apart by a sibling argument (a `const`
"kind", say), are typed as a whole: `ToolSchema.type_arguments` tries each alternative in
order (every combination of one branch per choice, at most MAX_VARIANTS) and keeps the first
under which every argument fits and every key that alternative requires is present, whatever
the order of the keys. When none fits, the arguments are typed key by key over the merged
branches (as for any other tool) and a note says they fit no alternative. Such a tool's
values depend on later keys, so its arguments are not streamed value by value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from flint_graph.errors import InvalidRequestError

_MAX_DEPTH = 32  # nesting of $ref/allOf/...; deeper counts as "anything" (cycles end here)
_NO_JSON = object()
_COMBINATORS = ("allOf", "anyOf", "oneOf")
MAX_VARIANTS = 64  # alternatives of a root choice tried one by one (more: key by key only)
# Subschemas a tool's parameters may expand to, following $ref, the combinators, properties
# and additionalProperties to _MAX_DEPTH: every walk below follows a subset of those edges, so
# a schema within this budget bounds them all (`allOf: [{"$ref": "#"}]` three times expands
# to 3^32 nodes: it is refused when declared, not typed for minutes)
MAX_SCHEMA_NODES = 20_000
JSON_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
# Keywords whose value is a subschema, a list of them, or a map to them (JSON Schema 2020-12,
# with draft-7's definitions / additionalItems / dependencies): the declaration check walks
# them all, although typing reads only some
_ONE_SCHEMA = {"additionalProperties", "items", "additionalItems", "contains", "not", "if",
               "then", "else", "propertyNames", "unevaluatedProperties", "unevaluatedItems"}
_SCHEMA_LISTS = {"allOf", "anyOf", "oneOf", "prefixItems", "items"}
_NUMBER_KEYWORDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
_COUNT_KEYWORDS = {"minLength", "maxLength", "minItems", "maxItems", "minProperties",
                   "maxProperties", "minContains", "maxContains"}
_SCHEMA_MAPS = {"properties", "patternProperties", "dependentSchemas", "$defs", "definitions",
                "dependencies"}


@dataclass(frozen=True)
class ToolSchema:
    """One tool's parameters: `root` (the base of its "#/..." references), the schema of
    each declared property (`extra`: the additionalProperties schema for the others, if any),
    the names its top-level "required" lists, and, for a root that is a choice of object
    schemas, each alternative (`variants`: ToolSchemas of one branch per choice). `others`:
    its top-level additionalProperties as given (True or a schema: other arguments are
    expected; False: none may come; None: not said, so JSON Schema admits them undescribed)."""

    root: Any
    properties: dict[str, Any]
    extra: Any = None
    required: tuple[str, ...] = ()
    variants: tuple["ToolSchema", ...] = ()
    others: Any = None

    def undeclared(self, keys) -> list[str]:
        """The names among `keys` this tool neither declares nor expects (additionalProperties
        absent or false; none for a tool without declared properties or with alternatives)."""
        if not self.properties or self.variants or (
                self.others is not None and self.others is not False):
            return []
        return [k for k in keys if k not in self.properties]

    def param(self, key: str) -> Any:
        """The schema of argument `key`, or None when the tool does not describe it."""
        return self.properties.get(key, self.extra)

    def type_arguments(self, texts: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
        """Type a whole call's arguments (key -> text as written) -> (key -> value, notes per
        key "'key': note" or for the whole call). Without variants: `type_argument` key by
        key. With variants: the first alternative that types every argument without a note
        and has every key it requires (module docstring)."""
        for v in self.variants:
            typed = {k: type_argument(t, v.param(k), self.root) for k, t in texts.items()}
            if all(note is None for _, note in typed.values()) and all(
                    k in texts for k in v.required):
                return {k: value for k, (value, _) in typed.items()}, []
        args, notes = {}, []
        for k, t in texts.items():
            args[k], note = type_argument(t, self.param(k), self.root)
            if note is not None:
                notes.append(f"argument {k!r}: {note}")
        if self.variants:
            notes.append(f"the arguments fit none of the {len(self.variants)} alternatives of "
                         "the tool's parameters (anyOf/oneOf); typed key by key")
        return args, notes


def tool_schemas(tools: list[dict] | None) -> dict[str, ToolSchema] | None:
    """Map tool name -> ToolSchema from OpenAI tool objects (None: no tools to check against).

    Raises InvalidRequestError for a list that is not OpenAI function tools with unique names.
    """
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise InvalidRequestError(f"tools: expected a list of tool objects, found {type(tools)}")
    schemas: dict[str, ToolSchema] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name or tool.get("type", "function") != "function":
            raise InvalidRequestError(
                f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': str, ...}}}}, "
                f"found {str(tool)[:120]}"
            )
        if name in schemas:
            raise InvalidRequestError(f"tools[{i}]: duplicate function name {name!r}")
        params = fn.get("parameters")
        root = params if isinstance(params, dict) else {}
        _check_declaration(root, f"tools[{i}] {name[:60]!r}")
        extra = root.get("additionalProperties")
        required = root.get("required")
        alternatives = _root_variants(root)
        if alternatives is None:
            raise InvalidRequestError(
                f"tools[{i}] {name[:60]!r}: its parameters are a choice of more than "
                f"{MAX_VARIANTS} alternatives (anyOf/oneOf combinations); arguments are typed "
                "by the one they fit, so at most that many are supported")
        variants = tuple(ToolSchema(root, _properties(v, root, 0), _extra(v, root, 0, extra),
                                    _required(v, root, 0))
                         for v in alternatives)
        schemas[name] = ToolSchema(root, _properties(root, root, 0),
                                   extra if isinstance(extra, dict) else None,
                                   tuple(k for k in required if isinstance(k, str))
                                   if isinstance(required, list) else (), variants, extra)
    return schemas


def _check_declaration(root: Any, where: str) -> None:
    """Raise InvalidRequestError when the parameters schema expands past MAX_SCHEMA_NODES
    subschemas (module constant), or when a subschema's `type` is not a JSON Schema type name
    (or a list of them): `"type": "int"` had been accepted and then admitted any value. Every
    subschema keyword is walked (items, $defs, not, ...), to _MAX_DEPTH. Walked by an explicit
    stack, so no recursion either."""
    stack, seen, reached = [(root, 0, "parameters")], 0, 0  # reached: through $ref or a combinator
    while stack:
        node, depth, path = stack.pop()
        if not isinstance(node, dict) or depth > _MAX_DEPTH:
            continue
        seen += 1
        if seen > MAX_SCHEMA_NODES:
            # the cycle hint only where references or combinators made most of them (a flat
            # schema of 60,000 properties was asked about cycles: a bad-input trial)
            why = ("$ref / allOf / anyOf / oneOf repeat what they reach: a reference cycle "
                   "under a combinator?" if reached > seen // 2 else
                   "counting every property, item and combinator branch")
            raise InvalidRequestError(
                f"{where}: its parameters schema expands to more than {MAX_SCHEMA_NODES:,} "
                f"subschemas ({why}); simplify it")
        if path.endswith("]") or path.startswith("#"):
            reached += 1
        kind = node.get("type")
        kinds = kind if isinstance(kind, list) else [kind] if "type" in node else []
        bad = [k for k in kinds if k not in JSON_TYPES]
        if bad or (isinstance(kind, list) and not kind):
            raise InvalidRequestError(
                f"{where}: {path[:200]}.type is {_dumps(kind)[:80]}; expected one of "
                f"{', '.join(JSON_TYPES)} or a non-empty list of them (JSON Schema)")
        if depth == 0 and kinds and "object" not in kinds:
            raise InvalidRequestError(  # OpenAI's rule: arguments are one JSON object
                f"{where}: parameters.type is {_dumps(kind)[:80]}; a tool's parameters are "
                "an object schema (\"type\": \"object\")")
        _check_keywords(node, root, where, path[:200])
        ref = node.get("$ref")
        subs = [(_deref(node, root), ref if isinstance(ref, str) else path)]
        for key, value in node.items():  # every place JSON Schema puts subschemas
            if key in _ONE_SCHEMA:
                subs.append((value, f"{path}.{key}"))
            elif key in _SCHEMA_LISTS and isinstance(value, list):
                subs += [(v, f"{path}.{key}[{j}]") for j, v in enumerate(value)]
            elif key in _SCHEMA_MAPS and isinstance(value, dict):
                subs += [(v, f"{path}.{key}.{k}") for k, v in value.items()]
        # definitions last: one in use is met first through its $ref, named by that
        subs.sort(key=lambda sp: sp[1].startswith((f"{path}.$defs.", f"{path}.definitions.")))
        # pushed reversed, so the walk meets properties in the order the schema lists them and
        # a refusal names the first bad one
        stack += [(sub, depth + 1, p) for sub, p in reversed(subs) if isinstance(sub, dict)]


def _check_keywords(node: dict, root: Any, where: str, path: str) -> None:
    """Raise InvalidRequestError for a keyword of schema `node` whose value JSON Schema does not
    allow (a bad-input trial, 2026-12-05: `"required": "value"`, `"properties": [1, 2]`, a
    property schema `5`, `"enum": "abc"`, `"anyOf": []` and a `$ref` to nothing were
    accepted, and some then silently ignored): `required` a list of strings, `properties` and
    the other maps objects of schemas (objects or booleans), `enum` an array, the combinators
    non-empty arrays of schemas, `$ref` a string and, when local ("#..."), one that resolves
    (a remote one is not fetched: the tool checks its own input)."""
    def fail(key: str, expected: str) -> InvalidRequestError:
        return InvalidRequestError(f"{where}: {path}.{key} is {_dumps(node[key])[:80]}; "
                                   f"expected {expected} (JSON Schema)")

    def is_schema(v: Any) -> bool:
        return isinstance(v, (dict, bool))

    req = node.get("required", [])
    if not isinstance(req, list) or not all(isinstance(k, str) for k in req):
        raise fail("required", "a list of property names")
    for key in _SCHEMA_MAPS & node.keys():
        value = node[key]
        if not isinstance(value, dict) or (key != "dependencies" and not all(
                is_schema(v) for v in value.values())):
            raise fail(key, "an object whose values are schemas (objects or booleans)")
    if "enum" in node and not (isinstance(node["enum"], list) and node["enum"]):
        # [] admits no value, so no call could ever be valid (a bad-input trial, 2026-12-06)
        raise fail("enum", "a non-empty array of the allowed values")
    for key in _COMBINATORS:
        if key in node and not (isinstance(node[key], list) and node[key]
                                and all(is_schema(v) for v in node[key])):
            raise fail(key, "a non-empty array of schemas")
    for key in _ONE_SCHEMA - {"items"}:
        if key in node and not is_schema(node[key]):
            raise fail(key, "a schema (an object or a boolean)")
    if "prefixItems" in node and not (isinstance(node["prefixItems"], list) and node["prefixItems"]
                                      and all(is_schema(v) for v in node["prefixItems"])):
        raise fail("prefixItems", "a non-empty array of schemas")  # a re-trial, 2026-12-07
    items = node.get("items", True)  # `"items": 5` was accepted (a bad-input trial, 2026-12-07)
    if not (is_schema(items) or (isinstance(items, list) and all(is_schema(v) for v in items))):
        raise fail("items", "a schema (an object or a boolean) or an array of schemas")
    # value constraints are the tool's to check (module doc), but a value JSON Schema
    # forbids for one is refused like the rest (a bad-input trial, 2026-12-07: `multipleOf: 0`,
    # `minimum: "x"` and `pattern: 5` were accepted); a pattern is ECMA-262, not compiled here
    for key in _NUMBER_KEYWORDS & node.keys():
        v = node[key]
        draft4 = key.startswith("exclusive") and isinstance(v, bool)  # draft 4's flag form
        if not draft4 and not _is_number(v):
            raise fail(key, "a number")
    if "multipleOf" in node and not (_is_number(node["multipleOf"]) and node["multipleOf"] > 0):
        raise fail("multipleOf", "a number above 0")
    for key in _COUNT_KEYWORDS & node.keys():
        v = node[key]
        if isinstance(v, float) and v.is_integer():
            v = int(v)  # 2.0 is an integer in JSON Schema
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            raise fail(key, "a non-negative integer")
    for key in ("pattern", "format") & node.keys():
        if not isinstance(node[key], str):
            raise fail(key, "a string")
    if "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str):
            raise fail("$ref", "a string")
        if ref.startswith("#") and _deref(node, root) is None and ref != "#":
            raise fail("$ref", "a reference to a part of this tool's parameters")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _has_properties(schema: Any, root: Any) -> bool:
    return bool(_properties(schema, root, 0))


def _root_variants(root: Any) -> list[Any] | None:
    """The alternatives of a parameters schema whose root (or the root's $ref target or allOf
    parts) holds an anyOf/oneOf of object schemas: copies of the root with each such choice
    narrowed to one branch (every combination, in order); [] when the root has no such
    choice, None when it has more than MAX_VARIANTS combinations."""
    out = _variants(root, root, 0)
    if len(out) > MAX_VARIANTS:
        return None
    return out if len(out) > 1 else []


def _extra(schema: Any, root: Any, depth: int, default: Any) -> Any:
    """The additionalProperties of a narrowed alternative: False if it or any part of it
    ($ref target, allOf, a one-branch anyOf/oneOf) forbids other keys, else the first schema
    one gives, else `default` (the root's, when a schema)."""
    found = _extra_parts(schema, root, depth)
    if any(e is False for e in found):
        return False
    schemas = [e for e in found if isinstance(e, dict)]
    return schemas[0] if schemas else (default if isinstance(default, dict) else None)


def _extra_parts(schema: Any, root: Any, depth: int) -> list[Any]:
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return []
    out = [schema["additionalProperties"]] if "additionalProperties" in schema else []
    for sub in _narrowed_parts(schema, root):
        out += _extra_parts(sub, root, depth + 1)
    return out


def _narrowed_parts(schema: dict, root: Any) -> list[Any]:
    """The parts of a narrowed alternative whose keywords all hold: its $ref target, its allOf
    parts and the branch of a one-branch anyOf/oneOf."""
    subs = [_deref(schema, root), *_list(schema, "allOf")]
    return subs + [b for g in ("anyOf", "oneOf") for b in _list(schema, g)
                   if len(_list(schema, g)) == 1]


def _variants(schema: Any, root: Any, depth: int) -> list[Any]:
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return [schema]
    options: list[list[tuple[str, Any]]] = []  # per place: (key, narrowed value) choices
    target = _deref(schema, root)
    if target is not None:
        options.append([("$ref", t) for t in _variants(target, root, depth + 1)])
    parts = _list(schema, "allOf")
    for i, part in enumerate(parts):
        options.append([(f"allOf.{i}", v) for v in _variants(part, root, depth + 1)])
    for group in ("anyOf", "oneOf"):
        branches = _list(schema, group)
        if len(branches) > 1 and all(_has_properties(b, root) for b in branches):
            options.append([(group, b) for b in branches])
    combos: list[dict] = [dict(schema)]
    for choices in options:
        if len(choices) == 1 and choices[0][0] != "$ref":
            continue  # nothing to choose here
        nxt = []
        for base in combos:
            for key, value in choices:
                v = dict(base)
                if key == "$ref":  # inline the (narrowed) target in place of the reference
                    v.pop("$ref", None)
                    v["allOf"] = [*_list(v, "allOf"), value]
                elif key.startswith("allOf."):  # parts keep their places (a $ref inlined
                    cur = list(v["allOf"])        # above comes after them)
                    cur[int(key.split(".")[1])] = value
                    v["allOf"] = cur
                else:
                    v[key] = [value]
                nxt.append(v)
                if len(nxt) > MAX_VARIANTS:
                    return nxt
        combos = nxt
    return combos


def _required(schema: Any, root: Any, depth: int) -> tuple[str, ...]:
    """The keys an (already narrowed) parameters schema requires: its own "required", its
    $ref target's, its allOf parts' and those of a one-branch anyOf/oneOf."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return ()
    out = [k for k in _list(schema, "required") if isinstance(k, str)]
    for sub in _narrowed_parts(schema, root):
        out += [k for k in _required(sub, root, depth + 1) if k not in out]
    return tuple(dict.fromkeys(out))


def _properties(schema: Any, root: Any, depth: int) -> dict[str, Any]:
    """Property schemas of an object schema, through $ref and the combinators: the same key
    from several places must satisfy all of them (allOf), or one of the branches (anyOf)."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return {}
    found: dict[str, list[Any]] = {}
    props = schema.get("properties")
    for key, sub in (props.items() if isinstance(props, dict) else ()):
        found.setdefault(key, []).append(sub)
    target = _deref(schema, root)
    parts = [target] if target is not None else []
    parts += schema.get("allOf") if isinstance(schema.get("allOf"), list) else []
    for part in parts:
        for key, sub in _properties(part, root, depth + 1).items():
            found.setdefault(key, []).append(sub)
    for group in ("anyOf", "oneOf"):
        branches = [_properties(b, root, depth + 1) for b in _list(schema, group)]
        for key in {k for b in branches for k in b}:
            found.setdefault(key, []).append({"anyOf": [b[key] for b in branches if key in b]})
    return {k: v[0] if len(v) == 1 else {"allOf": v} for k, v in found.items()}


def _list(schema: dict, key: str) -> list:
    value = schema.get(key)
    return value if isinstance(value, list) else []


def _deref(schema: dict, root: Any) -> Any:
    """The target of a local `$ref` ("#", "#/a/b" with ~0 ~1 and %-escapes); None if absent."""
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None  # remote references are not fetched: not checked
    node = root
    for part in (p for p in unquote(ref[1:]).split("/")[1:]):
        if "~" in part.replace("~0", "").replace("~1", ""):
            return None  # "~" escapes only 0 and 1 in a JSON Pointer (RFC 6901): "a~2b" is none
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif (isinstance(node, list) and part.isascii() and part.isdigit() and len(part) < 10
              and int(part) < len(node)):  # "²" is a digit to isdigit(), not to int()
            node = node[int(part)]
        else:
            return None  # a dangling reference constrains nothing
    return node


def _is_type(value: Any, name: Any) -> bool:
    if name == "string":
        return isinstance(value, str)
    if name == "integer":  # JSON Schema counts 2.0 as an integer
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "null":
        return value is None
    return True  # unreachable for declared tools: tool_schemas refuses other names


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but true != 1 and "1" != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def admits(schema: Any, value: Any, root: Any, depth: int = 0) -> bool:
    """Whether `value` satisfies the type-deciding keywords of `schema` (module docstring)."""
    if schema is False:
        return False
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return True
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else []
    if kinds and not any(_is_type(value, k) for k in kinds):
        return False
    if "enum" in schema and isinstance(schema["enum"], list) and not any(
            _equal(value, e) for e in schema["enum"]):
        return False
    if "const" in schema and not _equal(value, schema["const"]):
        return False
    target = _deref(schema, root)
    if target is not None and not admits(target, value, root, depth + 1):
        return False
    if not all(admits(s, value, root, depth + 1) for s in _list(schema, "allOf")):
        return False
    return all(not _list(schema, g) or any(admits(s, value, root, depth + 1)
                                           for s in _list(schema, g)) for g in ("anyOf", "oneOf"))


def _types_declared(schema: Any, root: Any, depth: int = 0) -> bool:
    """Whether the schema says anything about the JSON type of a value (else: free-form)."""
    if schema is False:
        return True
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return False
    if any(k in schema for k in ("type", "enum", "const")):
        return True
    subs = [s for g in _COMBINATORS for s in _list(schema, g)] + [_deref(schema, root)]
    return any(_types_declared(s, root, depth + 1) for s in subs if s is not None)


def only_strings(schema: Any, root: Any, depth: int = 0) -> bool:
    """True when the schema admits no value but strings (then the argument is its verbatim text,
    whatever it turns out to be, and can be streamed before `</arg_value>`)."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return False
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and kind and all(k == "string" for k in kind)):
        return True
    enum = schema.get("enum")
    if isinstance(enum, list) and all(isinstance(e, str) for e in enum):
        return True
    if isinstance(schema.get("const", 0), str):
        return True
    target = _deref(schema, root)
    if target is not None and only_strings(target, root, depth + 1):
        return True
    if any(only_strings(s, root, depth + 1) for s in _list(schema, "allOf")):
        return True  # every keyword must hold, so one strings-only part is enough
    return any(_list(schema, g) and all(only_strings(s, root, depth + 1) for s in _list(schema, g))
               for g in ("anyOf", "oneOf"))


MAX_JSON_DEPTH = 64  # nesting of an argument value read as JSON (deeper: kept as text)


def _json(text: str) -> Any:
    """json.loads, or _NO_JSON. NaN and Infinity are refused, spelled out or reached by
    overflow (`1e999`): json.dumps would write them as `Infinity`, which is not JSON, into the
    call's arguments. So is JSON nested deeper than MAX_JSON_DEPTH (960 levels decoded on the
    engine's thread and failed to encode again on the server's deeper stack: a 500), and JSON
    whose strings hold a lone surrogate (`"\ud800"`: no UTF-8 encoding; a 500 too)."""
    try:
        value = json.loads(text, parse_constant=_refuse, parse_float=_finite)
    except (ValueError, RecursionError):
        return _NO_JSON
    return value if _sound(value) else _NO_JSON


def _sound(value: Any) -> bool:
    """No deeper than MAX_JSON_DEPTH and every string encodable as UTF-8 (an explicit stack:
    no recursion on untrusted depth)."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return False
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(v, list):
            stack += [(x, depth + 1) for x in v]
        elif isinstance(v, dict):
            stack += [(x, depth + 1) for x in (*v.keys(), *v.values())]
    return True


def _refuse(name: str) -> Any:
    raise ValueError(name)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows a float")
    return value


def type_argument(text: str, schema: Any, root: Any) -> tuple[Any, str | None]:
    """Type one argument's text by its schema: (value, note), note None unless a repair step
    was taken or the text fits no reading (then the value is the text). Module docstring."""
    stripped = text.strip()
    decoded = _json(stripped)
    if schema is None or not _types_declared(schema, root):
        return (text if decoded is _NO_JSON else decoded), None

    def fits(value: Any) -> bool:
        try:
            return admits(schema, value, root)
        except RecursionError:  # comparing with a deeply nested enum/const value
            return False

    if stripped == "null" and fits(None):
        return None, None
    if decoded is not _NO_JSON and not isinstance(decoded, str) and fits(decoded):
        return decoded, None  # string-or-number etc.: the JSON reading, as other parsers do
    if fits(text):
        return text, None
    if stripped in ("True", "False") and fits(stripped == "True"):
        return stripped == "True", None
    if isinstance(decoded, str):  # the value was JSON-quoted: "42", "true", "[1, 2]"
        inner = _json(decoded.strip())
        if isinstance(inner, (bool, int, float, list, dict)) and fits(inner):
            return inner, f"read the quoted value {stripped} as {_dumps(inner)}"
    if stripped[:1] in ("[", "{") and '\\"' in stripped:  # [{\"id\": \"1\"}]
        unescaped = _json_string_body(stripped)
        inner = _json(unescaped) if unescaped is not None else _NO_JSON
        if isinstance(inner, (list, dict)) and fits(inner):
            return inner, f"decoded the backslash-escaped JSON {_short(stripped)}"
    return text, f"{_short(text)} does not fit the parameter's schema; kept as text"


def _json_string_body(text: str) -> str | None:
    """`text` read as the inside of a JSON string literal (undoing \\" and friends), or None."""
    try:
        return json.loads(f'"{text}"', strict=False)
    except ValueError:
        return None


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")
