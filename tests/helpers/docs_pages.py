"""The documentation's pages as scripts: their code blocks, in order, on tiny data.

Every ```python block of a page runs, in the order of the page, in one fresh
Python process per page (or per part of a page), after `PREAMBLE`, which gives
the names a user's script would have: `model`, `train_ds`, `val_ds`,
`train_step`, `optimizer`, `loss_fn`, and `np`, `tf`, `keras`, `kpt`.

HTML comments steer it; they are not shown on the rendered page:

- `<!-- docs-test: skip REASON -->` before a block: it does not run, for the
  reason given (a reason is required).
- `<!-- docs-test: run -->` before a ```bash block: it runs too, in the page's
  folder, and must exit with status 0.
- `<!-- docs-test: setup` ... `-->`: code the page does not show, run at that point.
- `<!-- docs-test: new-script -->`: what follows runs in a new process.
- `<!-- docs-test: page backend=jax preamble=none -->`: the page's Keras
  backend; whether it runs without the preamble, as a script of its own.

The README's code runs in every test run; the pages' code, some 15 s a page,
in the pass of tests marked slow (`-m slow`), which CI runs too.
"""

import dataclasses
import pathlib
import re
import textwrap
from typing import List
from typing import Optional

from tests.helpers.paths import REPO_ROOT

DOCS = REPO_ROOT / "docs"
README = REPO_ROOT / "README.md"

PREAMBLE = """\
import os
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
import subprocess

import keras
import numpy as np
import tensorflow as tf

import keras_pipeline_tuner as kpt


def _shell(command):
    subprocess.run(["bash", "-euo", "pipefail", "-c", command], check=True)


_rng = np.random.default_rng(0)
_x = _rng.random((256, 8, 8, 1), dtype=np.float32)
_y = (_x.mean(axis=(1, 2, 3)) > 0.5).astype("int32")
train_ds = tf.data.Dataset.from_tensor_slices((_x, _y)).shuffle(256).batch(16)
val_ds = tf.data.Dataset.from_tensor_slices((_x[:64], _y[:64])).batch(16)
model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Flatten(),
    keras.layers.Dense(16, activation="relu"),
    keras.layers.Dense(2),
])
model.compile(
    optimizer="adam",
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
optimizer = keras.optimizers.Adam()
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

if keras.backend.backend() == "tensorflow":

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_weights)
        optimizer.apply_gradients(zip(grads, model.trainable_weights))
        return loss

"""

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)")
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<body>.*?)\s*(?P<end>-->)?\s*$")


@dataclasses.dataclass
class Block:
    """One fenced block of a page."""

    lang: str
    code: str
    line: int
    skip: Optional[str] = None  # the reason it does not run
    run: bool = False  # a shell block asked to run
    hidden: bool = False  # setup code the page does not show
    new_script: bool = False  # starts a new process


@dataclasses.dataclass
class Page:
    path: pathlib.Path
    blocks: List[Block]
    backend: str = "tensorflow"
    preamble: bool = True

    @property
    def slow(self) -> bool:
        """Whether its code runs in the slow pass: every page's but the README's."""
        return self.path != README

    @property
    def name(self) -> str:
        return str(self.path.relative_to(REPO_ROOT))

    def scripts(self) -> List[str]:
        """The page's code as scripts, each run in a process of its own."""
        scripts, parts = [], []
        for block in self.blocks:
            if block.new_script and parts:
                scripts.append(parts)
                parts = []
            if block.skip is not None:
                continue
            if block.lang in ("python", "py"):
                parts.append(f"# {self.name}:{block.line}\n{block.code}")
            elif block.run:
                parts.append(f"# {self.name}:{block.line}\n_shell({block.code!r})")
        if parts:
            scripts.append(parts)
        preamble = PREAMBLE if self.preamble else ""
        return [preamble + "\n\n".join(parts) + "\n" for parts in scripts]

    def runs_code(self) -> bool:
        return bool(self.scripts())


def read_page(path: pathlib.Path) -> Page:
    """Parses a page's fenced blocks and the directives that steer them."""
    lines = path.read_text().splitlines()
    page = Page(path=path, blocks=[])
    pending = {}
    index = 0
    while index < len(lines):
        line = lines[index]
        directive = _DIRECTIVE.match(line)
        if directive:
            body = directive.group("body")
            word, _, rest = body.partition(" ")
            if word == "setup":
                code, index = _until_comment_end(lines, index + 1)
                page.blocks.append(
                    Block("python", code, index, hidden=True, new_script=pending.pop("new", False))
                )
            elif word == "skip":
                if not rest.strip():
                    raise ValueError(f"{path}:{index + 1}: a skip needs its reason")
                pending["skip"] = rest.strip()
            elif word == "run":
                pending["run"] = True
            elif word == "new-script":
                pending["new"] = True
            elif word == "page":
                for option in rest.split():
                    key, _, value = option.partition("=")
                    if key == "backend":
                        page.backend = value
                    elif option == "preamble=none":
                        page.preamble = False
                    else:
                        raise ValueError(f"{path}:{index + 1}: unknown option {option!r}")
            else:
                raise ValueError(f"{path}:{index + 1}: unknown directive {body!r}")
            index += 1
            continue
        fence = _FENCE.match(line)
        if fence:
            indent = fence.group("indent")
            end = index + 1
            while end < len(lines) and not lines[end].strip().startswith("```"):
                end += 1
            code = textwrap.dedent("\n".join(lines[index + 1 : end]))
            del indent
            page.blocks.append(
                Block(
                    lang=fence.group("lang"),
                    code=code,
                    line=index + 1,
                    skip=pending.pop("skip", None),
                    run=pending.pop("run", False),
                    new_script=pending.pop("new", False),
                )
            )
            index = end + 1
            continue
        index += 1
    return page


def _until_comment_end(lines: List[str], start: int):
    end = start
    while end < len(lines) and lines[end].strip() != "-->":
        end += 1
    return textwrap.dedent("\n".join(lines[start:end])), end


def pages() -> List[Page]:
    """Every page of the site, and the README."""
    return [read_page(path) for path in sorted(DOCS.glob("*.md"))] + [read_page(README)]


def prose(text: str) -> List[str]:
    """The sentences of a page's prose: code, comments and markup left out.

    Paragraphs, list items and table cells are read apart; a sentence ends at
    ".", "!" or "?" followed by a space.
    """
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    paragraphs, current, in_code = [], [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        if stripped.startswith("|"):
            paragraphs.extend(cell for cell in stripped.strip("|").split("|"))
            continue
        starts_item = re.match(r"^([-*]|\d+\.)\s", stripped) or stripped.startswith("#")
        if not stripped or starts_item:
            if current:
                paragraphs.append(" ".join(current))
            current = [] if not stripped else [stripped]
            continue
        current.append(stripped)
    if current:
        paragraphs.append(" ".join(current))
    sentences = []
    for paragraph in paragraphs:
        paragraph = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", paragraph)
        for sentence in re.split(r"(?<=[.!?])\s+", paragraph):
            if sentence.strip():
                sentences.append(sentence.strip())
    return sentences
