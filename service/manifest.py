"""The model directory: the only contract between `export/` (which writes it) and `service/`.

A model directory holds `model.json` (this module's `Manifest`), one or more ONNX graphs and a
`tokenizer.json`. `load_model_dir` reads and verifies one without torch or onnxruntime: the
manifest must be complete, and every file it names must exist, match its sha256 and resolve
(links followed) inside the directory. A directory that does not match is refused with
`ModelDirError` naming the file and the cause. Graph roles per kind (`ROLES`, from service/kinds.py),
their variants (`VARIANTS`), the optional `attention` and `packed` graphs, and every tensor name:
docs/model-directory.md.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from service.kinds import KINDS as KIND_TABLE

MANIFEST_FILE = "model.json"
FORMAT_VERSION = 3  # written by this export; 2 changed the generation decoder's inputs, 3 the translator's
SUPPORTED_FORMATS = (2, 3)  # format 1 directories: rebuild with `make models`; format 2 translators too
KINDS = tuple(KIND_TABLE)  # the one table of kinds: service/kinds.py
CLASSIFIER_ACTIVATIONS = ("sigmoid", "softmax", "none")  # how a classification model's logits are read
PAIR_TRUNCATIONS = ("longest_first", "only_second")  # how a classification model cuts a pair past its limit
POOLINGS = ("mean", "cls", "max", "last")  # an embedding graph pools inside; the manifest says how
ROLES = {k.name: k.roles for k in KIND_TABLE.values()}  # kind -> the graphs it needs
VARIANTS = ("fp32", "optimized", "fp16", "int8", "int4")
EMBEDDERS = ("embedding", "sparse-embedding")  # the kinds with instruction prompts
ATTENTION_ROLE = "attention"  # optional, any kind, fp32 only
PACKED_ROLE = "packed"  # optional: several inputs per row (export/onnx/packed.py); older directories lack it
OPTIONAL_ROLES = {k.name: k.optional_roles for k in KIND_TABLE.values() if k.optional_roles}


class ModelDirError(ValueError):
    """A model directory that cannot be served; the message names the file and the cause."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name: "int64", "float32", "float16"
    shape: list[int | str]  # ints for fixed axes, names for dynamic ones


@dataclass(frozen=True)
class GraphSpec:
    role: str
    variant: str
    file: str
    sha256: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    parity: dict[str, Any] = field(default_factory=dict)  # figures measured by the gate at export
    # {"file", "sha256"} of the file holding the graph's tensors, for a graph past protobuf's 2 GiB
    # (onnx's external data format, export/onnx/store.py); empty: they are inside `file`
    data: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def from_dict(d: dict) -> GraphSpec:
        return GraphSpec(
            role=d["role"],
            variant=d["variant"],
            file=d["file"],
            sha256=d["sha256"],
            inputs=[TensorSpec(**t) for t in d["inputs"]],
            outputs=[TensorSpec(**t) for t in d["outputs"]],
            parity=d.get("parity", {}),
            data=d.get("data", {}),
        )


@dataclass(frozen=True)
class Manifest:
    name: str
    kind: str
    architecture: dict[str, Any]  # the model's dataclass config, plus "type"
    graphs: list[GraphSpec]
    tokenizer: dict[str, Any]  # {"file", "sha256", "type"}
    special_tokens: dict[str, int]  # pad, bos, eos, unk, cls, sep, mask, decoder_start: whichever apply
    max_input_tokens: int
    opset: int
    versions: dict[str, str]  # torch, onnx, onnxruntime used at export
    parity: dict[str, Any]  # the gate's figures for the whole model
    pooling: str | None = None  # embedding: "mean" | "cls" | "max" (done inside the graph; informational)
    embedding_dim: int | None = None
    max_output_tokens: int | None = None  # generation / translation
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    # generation, optional: {"source", "special_tokens": {"bos_token": ...}, "templates": {name: {"file", "sha256"}},
    # "checked": figures} (export/convert/chat_template.py; docs/model-directory.md)
    chat_template: dict[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n"

    @staticmethod
    def from_dict(d: dict) -> Manifest:
        d = dict(d)
        d["graphs"] = [GraphSpec.from_dict(g) for g in d["graphs"]]
        return Manifest(**d)

    def graph(self, role: str, variant: str = "fp32") -> GraphSpec:
        for g in self.graphs:
            if g.role == role and g.variant == variant:
                return g
        have = sorted({f"{g.role}/{g.variant}" for g in self.graphs})
        raise KeyError(f"model {self.name!r} has no {role}/{variant} graph (has: {', '.join(have)})")

    def variants(self, role: str) -> list[str]:
        return [g.variant for g in self.graphs if g.role == role]


@dataclass(frozen=True)
class ModelDir:
    path: Path
    manifest: Manifest

    def file(self, name: str) -> Path:
        return self.path / name


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_model_dir(path: str | Path, verify_hashes: bool = True) -> ModelDir:
    """Read and verify a model directory; raises ModelDirError naming the file and the cause."""
    path = Path(path)
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.is_file():
        raise ModelDirError(f"{manifest_path}: missing (not a model directory)")
    try:
        manifest = Manifest.from_dict(json.loads(manifest_path.read_text(encoding="utf-8")))
    except (ValueError, TypeError, KeyError, AttributeError) as e:  # ValueError: bad JSON or UTF-8
        raise ModelDirError(f"{manifest_path}: malformed manifest ({type(e).__name__}: {e})") from e
    except OSError as e:
        raise ModelDirError(f"{manifest_path}: unreadable ({e})") from e
    _check_manifest(manifest, manifest_path)
    files = [(g.file, g.sha256) for g in manifest.graphs] + [(manifest.tokenizer["file"], manifest.tokenizer["sha256"])]
    files += [(g.data["file"], g.data["sha256"]) for g in manifest.graphs if g.data]
    files += [(t["file"], t["sha256"]) for t in (manifest.chat_template or {}).get("templates", {}).values()]
    for name, expected in files:
        f = inside(path, name, manifest_path)
        if not f.is_file():
            raise ModelDirError(f"{f}: missing (named in {MANIFEST_FILE})")
        if verify_hashes:
            actual = sha256_file(f)
            if actual != expected:
                raise ModelDirError(
                    f"{f}: sha256 mismatch (manifest says {expected[:16]}..., file has {actual[:16]}...); "
                    "the file was modified or the manifest is stale: re-export the model"
                )
    return ModelDir(path=path, manifest=manifest)


def inside(directory: Path, name: str, where: Path) -> Path:
    """directory / name, refused (ModelDirError) unless it resolves to a path inside directory."""
    if not isinstance(name, str) or not name or Path(name).is_absolute():
        raise ModelDirError(f"{where}: file {name!r} must be a path relative to the model directory")
    root = directory.resolve()
    target = (root / name).resolve()
    if not target.is_relative_to(root):
        raise ModelDirError(
            f"{where}: file {name!r} resolves to {target}, outside the model directory {root} "
            "(a '..' or a symbolic link leads out); a model directory holds its own files"
        )
    return directory / name


def _check_manifest(m: Manifest, where: Path) -> None:
    if m.format_version not in SUPPORTED_FORMATS:
        raise ModelDirError(
            f"{where}: format_version {m.format_version} unsupported "
            f"(this service reads {', '.join(map(str, SUPPORTED_FORMATS))}: rebuild it with "
            "`make models`)"
        )
    if m.kind not in KINDS:
        raise ModelDirError(f"{where}: kind {m.kind!r} is not one of {', '.join(KINDS)}")
    for role in ROLES[m.kind]:
        if "fp32" not in m.variants(role):
            raise ModelDirError(f"{where}: kind {m.kind} needs an fp32 {role!r} graph")
    for g in m.graphs:
        if g.role == ATTENTION_ROLE and g.variant != "fp32":
            raise ModelDirError(f"{where}: graph {g.file}: the attention graph comes only as fp32")
        if g.variant not in VARIANTS or g.role not in (*ROLES[m.kind], *OPTIONAL_ROLES.get(m.kind, ()), ATTENTION_ROLE):
            raise ModelDirError(f"{where}: graph {g.file}: unknown role/variant {g.role}/{g.variant}")
        if Path(g.file).name != g.file:
            raise ModelDirError(f"{where}: graph file {g.file!r} must be a plain file name inside the directory")
        if g.data and (not {"file", "sha256"} <= set(g.data) or Path(g.data["file"]).name != g.data["file"]):
            raise ModelDirError(f"{where}: graph {g.file}: 'data' needs 'file' (a plain file name) and 'sha256'")
    if not {"file", "sha256"} <= set(m.tokenizer):
        raise ModelDirError(f"{where}: tokenizer entry needs 'file' and 'sha256'")
    if m.kind == "embedding" and (m.pooling not in POOLINGS or not m.embedding_dim):
        raise ModelDirError(f"{where}: an embedding model needs pooling ({'|'.join(POOLINGS)}) and embedding_dim")
    if m.kind == "sparse-embedding" and not m.embedding_dim:
        raise ModelDirError(f"{where}: a sparse-embedding model needs embedding_dim (its vocabulary size)")
    if m.kind == "fill-mask" and not {"mask", "pad"} <= set(m.special_tokens):
        raise ModelDirError(
            f"{where}: a fill-mask model needs special_tokens 'mask' and 'pad' "
            f"(has: {', '.join(sorted(m.special_tokens)) or 'none'})"
        )
    if m.kind == "classification":
        _check_classifier(m, where)
    if m.max_input_tokens <= 0:
        raise ModelDirError(f"{where}: max_input_tokens must be positive")
    _check_chat_template(m.chat_template, where)
    _check_prompts(m, where)
    ends = m.extra.get("eos_token_ids")
    if ends is not None and (
        not isinstance(ends, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ends)
    ):
        raise ModelDirError(f"{where}: extra.eos_token_ids must be a list of token ids, not {ends!r}")


def _check_classifier(m: Manifest, where: Path) -> None:
    """extra.labels (one name per logit, in id order), extra.activation and extra.truncation, how a pair
    past the limit is cut (absent: longest_first) (export/models/classifier.py)."""
    labels, activation = m.extra.get("labels"), m.extra.get("activation")
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels):
        raise ModelDirError(f"{where}: a classification model needs extra.labels, a list of label names")
    if activation not in CLASSIFIER_ACTIVATIONS:
        raise ModelDirError(
            f"{where}: extra.activation {activation!r} is not one of {', '.join(CLASSIFIER_ACTIVATIONS)}"
        )
    truncation = m.extra.get("truncation", "longest_first")
    if truncation not in PAIR_TRUNCATIONS:
        raise ModelDirError(f"{where}: extra.truncation {truncation!r} is not one of {', '.join(PAIR_TRUNCATIONS)}")


def _check_prompts(m: Manifest, where: Path) -> None:
    """extra.prompts ({name: prefix text}) and extra.default_prompt_name (one of them): an embedder's
    instruction prompts (export/convert/prompts.py)."""
    prompts, default = m.extra.get("prompts", {}), m.extra.get("default_prompt_name")
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ModelDirError(f"{where}: extra.prompts must map prompt names to prefix texts, not {prompts!r}")
    if prompts and m.kind not in EMBEDDERS:
        raise ModelDirError(f"{where}: extra.prompts is for embedding models, not a {m.kind} model")
    if default is not None and default not in prompts:
        raise ModelDirError(
            f"{where}: extra.default_prompt_name {default!r} is not one of extra.prompts "
            f"({', '.join(map(repr, prompts)) or 'none'})"
        )


def _check_chat_template(entry: Any, where: Path) -> None:
    if entry is None:
        return
    templates = entry.get("templates") if isinstance(entry, dict) else None
    if not isinstance(templates, dict) or not templates:
        raise ModelDirError(f"{where}: chat_template needs 'templates': {{name: {{'file', 'sha256'}}}}")
    for name, spec in templates.items():
        if not isinstance(spec, dict) or not {"file", "sha256"} <= set(spec) or Path(spec["file"]).name != spec["file"]:
            raise ModelDirError(f"{where}: chat_template {name!r} needs 'file' (a plain file name) and 'sha256'")
    special = entry.get("special_tokens", {})
    if not isinstance(special, dict) or not all(isinstance(v, str) for v in special.values()):
        raise ModelDirError(f"{where}: chat_template.special_tokens must map names to token texts")


def eos_token_ids(m: Manifest) -> frozenset[int]:
    """Every id a generation ends at: special_tokens' eos and extra.eos_token_ids (several, Llama 3)."""
    primary = [m.special_tokens["eos"]] if "eos" in m.special_tokens else []
    return frozenset([*primary, *m.extra.get("eos_token_ids", [])])


def discover(root: str | Path) -> list[Path]:
    """Model directories directly under root (those holding a model.json), sorted by name."""
    root = Path(root)
    return sorted(p for p in root.iterdir() if (p / MANIFEST_FILE).is_file()) if root.is_dir() else []
