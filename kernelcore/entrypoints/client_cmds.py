"""`kc chat` and `kc complete`: small streaming clients for a running `kc serve`."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import click


def _client_options(f):
    f = click.option("--url", envvar="KC_URL", default="http://127.0.0.1:8000", show_default=True, show_envvar=True,
                     help="Base URL of the server.")(f)
    f = click.option("--api-key", envvar="KC_API_KEY", default=None, show_envvar=True, help="Bearer key.")(f)
    f = click.option("--model", default=None, help="Model name [default: the first served model].")(f)
    f = click.option("--max-tokens", type=int, default=256, show_default=True)(f)
    f = click.option("--temperature", type=float, default=0.7, show_default=True)(f)
    return f


class Client:
    def __init__(self, url: str, api_key: str | None) -> None:
        import aiohttp

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self.session = aiohttp.ClientSession(headers=headers)

    async def model(self, model: str | None) -> str:
        if model:
            return model
        async with self.session.get(self.url + "/v1/models") as r:
            await _raise_for_error(r)
            return (await r.json())["data"][0]["id"]

    async def stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        async with self.session.post(self.url + path, json={**body, "stream": True}) as r:
            await _raise_for_error(r)
            async for line in r.content:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    return
                event = json.loads(data)
                if "error" in event:
                    raise click.ClickException(event["error"].get("message", str(event["error"])))
                yield event

    async def close(self) -> None:
        await self.session.close()


async def _raise_for_error(response) -> None:
    if response.status >= 400:
        text = await response.text()
        try:
            error = json.loads(text)["error"]
            text = error["message"] if isinstance(error, dict) else str(error)
        except (ValueError, KeyError, TypeError):
            pass
        raise click.ClickException(f"HTTP {response.status}: {text}")


def _run(coro) -> None:
    import aiohttp

    try:
        asyncio.run(coro)
    except aiohttp.ClientConnectionError as exc:
        raise click.ClickException(f"cannot reach the server: {exc} (is `kc serve` running?)") from None


CHAT_HELP = """Commands (handled here, never sent to the model):
  /help          this list
  /reset         forget the conversation (keeps the system message)
  /system TEXT   set the system message (and start over); /system alone clears it
  /exit, /quit   leave (Ctrl-D too)
  //TEXT         send a message that starts with a slash"""


class ChatSession:
    """The conversation of `kc chat` and its slash commands."""

    def __init__(self, system: str | None = None) -> None:
        self.system = system
        self.history: list[dict[str, str]] = []

    def messages(self) -> list[dict[str, str]]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.history

    def command(self, text: str) -> str | None:
        """The reply to a slash command, "" to leave, or None when ``text`` is a message for the model."""
        name, _, arg = text.strip().partition(" ")
        if not name.startswith("/") or name.startswith("//"):
            return None
        if name in ("/exit", "/quit"):
            return ""
        if name == "/help":
            return CHAT_HELP
        if name == "/reset":
            self.history = []
            return "(conversation cleared)"
        if name == "/system":
            self.system, self.history = arg.strip() or None, []
            return "(system message set; conversation cleared)" if self.system else "(system message cleared)"
        return f"unknown command {name}; /help lists the commands"


@click.command("chat")
@_client_options
@click.option("--system", default=None, help="A system message to start the conversation with.")
@click.option("-m", "--message", "messages", multiple=True, help="Send these user messages and exit (no prompt).")
def chat_cmd(url: str, api_key: str | None, model: str | None, max_tokens: int, temperature: float,
             system: str | None, messages: tuple[str, ...]) -> None:
    """Chat with a running server; replies stream as they are generated. /help lists the commands; Ctrl-D or
    /exit quits."""

    async def main() -> None:
        client = Client(url, api_key)
        try:
            name = await client.model(model)
            session = ChatSession(system)
            pending = list(messages)
            if not messages:
                click.echo(f"kc chat: model {name} at {client.url} (/help for commands, /exit or Ctrl-D to quit)")
            while True:
                if messages:
                    if not pending:
                        return
                    text = pending.pop(0)
                else:
                    try:
                        text = await asyncio.to_thread(input, "> ")
                    except EOFError:
                        return
                    reply = session.command(text)
                    if reply == "":
                        return
                    if reply is not None:
                        click.echo(reply)
                        continue
                    if text.startswith("//"):  # an escaped slash: the message itself starts with "/"
                        text = text[1:]
                session.history.append({"role": "user", "content": text})
                pieces = []
                body = {"model": name, "messages": session.messages(), "max_tokens": max_tokens,
                        "temperature": temperature}
                async for event in client.stream("/v1/chat/completions", body):
                    for choice in event["choices"]:
                        piece = choice["delta"].get("content") or ""
                        pieces.append(piece)
                        click.echo(piece, nl=False)
                click.echo()
                session.history.append({"role": "assistant", "content": "".join(pieces)})
        finally:
            await client.close()

    _run(main())


@click.command("complete")
@_client_options
@click.argument("prompt", required=False)
def complete_cmd(url: str, api_key: str | None, model: str | None, max_tokens: int, temperature: float,
                 prompt: str | None) -> None:
    """Complete PROMPT (or stdin) with a running server, streaming the text to stdout."""
    if prompt is None:
        prompt = sys.stdin.read()

    async def main() -> None:
        client = Client(url, api_key)
        try:
            body = {"model": await client.model(model), "prompt": prompt, "max_tokens": max_tokens,
                    "temperature": temperature}
            async for event in client.stream("/v1/completions", body):
                for choice in event["choices"]:
                    click.echo(choice["text"], nl=False)
            click.echo()
        finally:
            await client.close()

    _run(main())
