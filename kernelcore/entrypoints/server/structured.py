"""Request fields that constrain the output: response_format, structured_outputs and the guided_* spellings.

Each becomes one :class:`StructuredOutputsParams`; the front end compiles it (off the event loop, cached) with
the configured backend so a constraint no backend can compile is a 400 that never reaches the engine.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kernelcore.contract.structured_output_params import StructuredOutputsParams
from kernelcore.entrypoints.server.errors import APIError, bad_request

STRUCTURED_FIELDS = {"response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                     "guided_grammar", "guided_whitespace_pattern", "guided_decoding_backend"}
# Fields that change what a request means and that this server does not serve: a 400 naming the field, never a
# silent 200. (reasoning_effort is refused in the chat handler unless a reasoning parser is configured.)
REFUSED_FIELDS = ("audio", "modalities", "prediction", "web_search_options", "functions", "function_call",
                  "structural_tag", "logits_processors")
INFORMATIONAL_FIELDS = {"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
                        "request_id", "priority"}
_OPTION_KEYS = {"whitespace_pattern", "disable_fallback", "disable_any_whitespace", "disable_additional_properties"}
_KINDS = {"json", "json_object", "regex", "choice", "grammar"}


def _schema(value: Any, param: str) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise bad_request(f"`{param}` is not valid JSON: {exc}", param) from None
    if not isinstance(value, (dict, bool)):
        raise bad_request(f"`{param}` must be a JSON Schema object", param)
    return json.dumps(value)


def _from_response_format(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise bad_request("`response_format` must be an object with a string `type`", "response_format")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise bad_request("`response_format.json_schema` must be an object with a `schema`",
                              "response_format.json_schema")
        return {"json": _schema(spec["schema"], "response_format.json_schema.schema")}
    raise bad_request(f"`response_format.type` must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                      "response_format.type")


def _from_structured_outputs(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_request("`structured_outputs` must be an object", "structured_outputs")
    unknown = sorted(set(value) - _KINDS - _OPTION_KEYS - {"structural_tag"})
    if unknown:
        raise bad_request(f"Unknown field(s) in `structured_outputs`: {', '.join(unknown)}", "structured_outputs")
    if value.get("structural_tag") is not None:
        raise bad_request("`structured_outputs.structural_tag` is not supported", "structured_outputs.structural_tag")
    spec = {k: value[k] for k in _KINDS if value.get(k) not in (None, False)}
    if "json" in spec:
        spec["json"] = _schema(spec["json"], "structured_outputs.json")
    if value.get("whitespace_pattern") is not None:
        spec["whitespace_pattern"] = value["whitespace_pattern"]
    if value.get("disable_any_whitespace") is not None:
        if not isinstance(value["disable_any_whitespace"], bool):
            raise bad_request("`structured_outputs.disable_any_whitespace` must be a boolean",
                              "structured_outputs.disable_any_whitespace")
        spec["compact_whitespace"] = value["disable_any_whitespace"]
    return spec


def _from_guided(body: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if body.get("guided_json") is not None:
        spec["json"] = _schema(body["guided_json"], "guided_json")
    for field, key in (("guided_regex", "regex"), ("guided_choice", "choice"), ("guided_grammar", "grammar")):
        if body.get(field) is not None:
            spec[key] = body[field]
    return spec


def check_refused_fields(body: dict[str, Any]) -> None:
    for name in REFUSED_FIELDS:
        if body.get(name) not in (None, [], {}):
            raise bad_request(f"Unsupported request argument supplied: `{name}` is not served by this server", name)


def parse_constraint(body: dict[str, Any]) -> StructuredOutputsParams | None:
    """The request's one constraint, or None. More than one, or a malformed one, is a 400."""
    sources: list[tuple[str, dict[str, Any]]] = []
    if body.get("response_format") is not None:
        spec = _from_response_format(body["response_format"])
        if spec:
            sources.append(("response_format", spec))
    if body.get("structured_outputs") is not None:
        sources.append(("structured_outputs", _from_structured_outputs(body["structured_outputs"])))
    guided = _from_guided(body)
    if guided:
        sources.append(("guided_*", guided))
    if not sources:
        return None
    kinds = [(field, k) for field, spec in sources for k in spec if k in _KINDS]
    if not kinds and all(field == "structured_outputs" for field, _ in sources):
        return None  # options only (whitespace): they apply to a tool choice's constraint, see constraint_options
    if len(kinds) != 1:
        named = ", ".join(f"{field}:{k}" for field, k in kinds) or "none"
        raise bad_request(f"A request may carry exactly one output constraint, got {named}", sources[0][0])
    field, spec = next((f, s) for f, s in sources if kinds[0][1] in s)
    for _, other in sources:  # options (whitespace) may come from another field than the constraint itself
        spec.update({k: v for k, v in other.items() if k not in _KINDS and k not in spec})
    pattern = body.get("guided_whitespace_pattern")
    if pattern is not None and "whitespace_pattern" not in spec:
        spec["whitespace_pattern"] = pattern
    for key, kind in (("regex", str), ("grammar", str), ("whitespace_pattern", str)):
        if key in spec and not isinstance(spec[key], kind):
            raise bad_request(f"`{key}` must be a string", field)
    try:
        return StructuredOutputsParams(**spec)
    except (TypeError, ValueError) as exc:
        raise bad_request(str(exc), field) from None


def constraint_options(body: dict[str, Any]) -> dict[str, Any]:
    """The whitespace options of ``structured_outputs`` (for a constraint the request does not spell itself,
    such as a named or required tool choice's)."""
    value = body.get("structured_outputs")
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in _from_structured_outputs(value).items() if k not in _KINDS}


class FrontEndGrammars:
    """Validates constraints in the API process with the same backends as the engine (cached by source)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._compiler = None

    def compiler(self):
        if self._compiler is None:
            from kernelcore.structured_output.compiler import GrammarCompiler

            try:
                self._compiler = GrammarCompiler(self.engine.tokenizer, self.engine.vocab_size,
                                                 self.engine.config.decoding.structured_outputs_backend)
            except ValueError as exc:
                raise APIError(f"Structured outputs are not available: {exc}", 400) from None
        return self._compiler

    async def validate(self, params: StructuredOutputsParams, param: str) -> StructuredOutputsParams:
        if getattr(self.engine.config.decoding, "structured_outputs_compact_whitespace", False):
            params.compact_whitespace = True  # the server's default (a request may only make it stricter)
        compiler = self.compiler()
        try:
            backend, _ = await asyncio.to_thread(compiler.compile, params)
        except ValueError as exc:
            raise bad_request(f"Invalid {params.kind} constraint: {exc}", param) from None
        params.backend = backend.name
        return params
