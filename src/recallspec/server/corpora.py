"""Live corpora over HTTP: ``/v1/corpora`` adds, lists, shows and removes the corpora
the ``sam`` drafters draft from, while the server decodes. Only the HTTP side lives
here (the request shape, file-name confinement, status codes, JSON); the registry is
``recall/live_corpora.py: CorpusRegistry`` (``engine.corpora``).

``POST /v1/corpora`` takes ``{"name", "documents": [text, ...]}`` or ``{"name", "file"}``,
a file inside the directory the server was started with (``--corpus-dir``): documents
(``.txt``, ``.json``, ``.jsonl``, optionally ``.gz``) or an index file built offline
(``recallspec index build``; any other name), as ``CorpusRegistry.add_file`` tells them
apart. A client never names a path outside that directory: absolute paths, ``..`` and
symlinks leading out are refused (400), as is a file whose text or index header does
not load (400 with the loader's message, the server's directories left out:
unreadable, empty, truncated, another tokenizer's index). The answer is 202 with the
corpus as the registry reports it, ``status`` "loading": tokenizing and building (and
an index payload's checksum: a mismatch turns the corpus "failed") run in the
registry's background thread, never in the engine's step.

Nothing here blocks the event loop or the engine thread: files are read and an index's
header opened in a worker thread (``asyncio.to_thread``); the registry is safe to call
from any thread and holds its lock only for O(corpora) work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator

from recallspec.engine import Engine
from recallspec.errors import RecallspecError
from recallspec.server.errors import ApiError, parse

Name = Annotated[str, Field(strict=True, min_length=1, max_length=200)]


class CorpusRequest(BaseModel):
    """The body of ``POST /v1/corpora``: a name and either documents or a file."""

    model_config = ConfigDict(extra="forbid")

    name: Name
    documents: Annotated[list[Annotated[str, Field(strict=True, min_length=1)]],
                         Field(min_length=1)] | None = None
    file: StrictStr | None = None

    @model_validator(mode="after")
    def _one_source(self) -> CorpusRequest:
        if (self.documents is None) == (self.file is None):
            raise ValueError("give either documents (a list of texts) or file (a name "
                             "inside the server's --corpus-dir), not both")
        if self.documents is not None and not any(d.strip() for d in self.documents):
            raise ValueError("documents: no text (every document is blank)")
        return self


def resolve_file(corpus_dir: Path | None, name: str) -> Path:
    """``name`` as a file inside ``corpus_dir``, or an ``ApiError``: 400 without a
    corpus directory, for absolute paths, ``..``, symlinks leading out of the
    directory and non-files; 404 for a file that is not there."""
    if corpus_dir is None:
        raise ApiError(400, "this server loads no corpus files (it was started without "
                            "--corpus-dir); send the texts as documents instead", "file")
    if not name or "\0" in name:
        raise ApiError(400, "file: give a file name inside the corpus directory", "file")
    for pure in (PurePosixPath(name), PureWindowsPath(name)):
        if pure.is_absolute() or pure.anchor:
            raise ApiError(400, f"file: {name!r} is an absolute path; give a name relative "
                                "to the server's corpus directory", "file")
        if ".." in pure.parts:
            raise ApiError(400, f"file: {name!r} leads out of the corpus directory ('..')",
                           "file")
    root = corpus_dir.resolve()
    path = (root / name).resolve()  # follows symlinks: where the file really is
    if not path.is_relative_to(root):
        raise ApiError(400, f"file: {name!r} leads out of the corpus directory (a symlink)",
                       "file")
    if not path.exists():
        raise ApiError(404, f"file: no {name!r} in the corpus directory", "file",
                       "file_not_found")
    if not path.is_file():
        raise ApiError(400, f"file: {name!r} is not a file", "file")
    return path


def _relative(e: Exception, path: Path) -> str:
    """The loader's message without the server's directory layout in it."""
    return str(e).replace(str(path), path.name)


def corpus_json(info: Any) -> dict[str, Any]:
    """A registry ``CorpusInfo`` as JSON."""
    d = dataclasses.asdict(info)
    return {"object": "corpus", **{k: _plain(v) for k, v in d.items()}}


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, os.PathLike):
        return Path(v).name
    return str(v)


def add_corpus_routes(app: FastAPI, engine: Engine, authorize: Callable[[Request], None],
                      corpus_dir: Path | None) -> None:
    """``/v1/corpora`` on ``app`` over ``engine.corpora``."""
    root = f"{corpus_dir.resolve()}{os.sep}" if corpus_dir is not None else None

    def as_json(info: Any) -> dict[str, Any]:
        body = corpus_json(info)
        if root is not None and isinstance(body.get("error"), str):  # a background failure
            body["error"] = body["error"].replace(root, "")
        return body

    def lookup(call: Callable[[str], Any], corpus_id: str) -> Any:
        try:
            return call(corpus_id)
        except RecallspecError:  # the registry's DataError: an unknown id
            raise ApiError(404, f"no corpus {corpus_id!r}", "corpus_id",
                           "corpus_not_found") from None

    @app.post("/v1/corpora")
    async def add_corpus(request: Request) -> Response:
        authorize(request)
        req = await parse(request, CorpusRequest)
        reg = engine.corpora
        if req.documents is not None:
            try:
                info = await asyncio.to_thread(reg.add_documents, req.name, req.documents)
            except RecallspecError as e:  # the registry refused it up front
                raise ApiError(400, str(e)) from None
        else:
            assert req.file is not None
            path = resolve_file(corpus_dir, req.file)
            try:  # documents are read, an index's header checked (O(1)), off the loop
                info = await asyncio.to_thread(reg.add_file, req.name, path)
            except RecallspecError as e:
                raise ApiError(400, f"file: {_relative(e, path)}", "file") from None
        body = as_json(info)
        return JSONResponse(body, status_code=202,
                            headers={"Location": f"/v1/corpora/{body.get('id')}"})

    # Listing, looking up and removing take the registry's lock for O(corpora) work.
    @app.get("/v1/corpora")
    async def list_corpora(request: Request) -> Response:
        authorize(request)
        return JSONResponse({"object": "list",
                             "data": [as_json(i) for i in engine.corpora.list()]})

    @app.get("/v1/corpora/{corpus_id}")
    async def get_corpus(request: Request, corpus_id: str) -> Response:
        authorize(request)
        return JSONResponse(as_json(lookup(engine.corpora.get, corpus_id)))

    @app.delete("/v1/corpora/{corpus_id}")
    async def remove_corpus(request: Request, corpus_id: str) -> Response:
        authorize(request)
        return JSONResponse({**as_json(lookup(engine.corpora.remove, corpus_id)),
                             "deleted": True})
