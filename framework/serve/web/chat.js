// The chat page of `ortgen serve`: streams answers from /v1/chat/completions.
//
// Plain JavaScript, no build step, nothing fetched from outside. Model text is only ever
// put into the page as text (textContent, createTextNode): never as HTML, so an answer
// holding <script> or <img onerror=...> shows as those characters. Code fences become
// <pre><code> elements filled the same way.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "ortgen-api-key";
const chat = { turns: [], controller: null, apiKey: sessionStorage.getItem(KEY_STORE) || "" };

// ---------------------------------------------------------------- requests

function headers() {
  const h = { "Content-Type": "application/json" };
  if (chat.apiKey) h.Authorization = "Bearer " + chat.apiKey;
  return h;
}

class NeedsKey extends Error {}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: headers() });
  if (response.status === 401) {
    askForKey(chat.apiKey ? "That key was refused; try another." : "");
    throw new NeedsKey("this server needs an API key");
  }
  return response;
}

function askForKey(note) {
  $("api-key-bar").hidden = false;
  setStatus(note || "This server needs an API key.");
  $("api-key").focus();
}

async function loadModels() {
  try {
    const response = await api("/v1/models");
    const body = await response.json();
    const select = $("model");
    select.replaceChildren();
    for (const model of body.data || []) {
      const option = document.createElement("option");
      option.value = model.id;
      option.textContent = model.id;
      select.append(option);
    }
    setStatus("");
  } catch (error) {
    if (!(error instanceof NeedsKey)) setStatus("cannot list models: " + error.message);
  }
}

// ---------------------------------------------------------------- settings

function numberOf(id) {
  const text = $(id).value.trim();
  return text === "" ? null : Number(text);
}

/** The request body: the conversation so far and the settings as the page shows them. */
function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const turn of chat.turns) messages.push({ role: turn.role, content: turn.content });
  const body = {
    model: $("model").value,  // empty: the server's first model
    messages,
    stream: true,
    stream_options: { include_usage: true },
  };
  const settings = { temperature: "temperature", top_p: "top-p", max_tokens: "max-tokens", seed: "seed" };
  for (const [field, id] of Object.entries(settings)) {
    const value = numberOf(id);
    if (value !== null) body[field] = value;
  }
  const schema = $("json-schema").value.trim();
  if (schema) {
    body.response_format = {
      type: "json_schema",
      json_schema: { name: "page_schema", schema: JSON.parse(schema) },
    };
  }
  return body;
}

// ---------------------------------------------------------------- rendering

function setStatus(text) {
  $("status").textContent = text;
}

/** Append ``text`` to ``parent`` as paragraphs and code, as text only. */
function renderMarkdown(parent, text) {
  parent.replaceChildren();
  const fence = /```([^\n`]*)\n?([\s\S]*?)(?:```|$)/g;
  let last = 0;
  for (const match of text.matchAll(fence)) {
    renderProse(parent, text.slice(last, match.index));
    const pre = document.createElement("pre");
    const code = document.createElement("code");
    if (match[1].trim()) code.dataset.language = match[1].trim();
    code.textContent = match[2];
    pre.append(code);
    parent.append(pre);
    last = match.index + match[0].length;
  }
  renderProse(parent, text.slice(last));
}

function renderProse(parent, text) {
  for (const block of text.split(/\n{2,}/)) {
    if (!block.trim()) continue;
    const p = document.createElement("p");
    block.split("`").forEach((part, i) => {
      if (i % 2) {
        const code = document.createElement("code");
        code.textContent = part;
        p.append(code);
      } else {
        p.append(document.createTextNode(part));
      }
    });
    parent.append(p);
  }
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "message " + (role === "user" ? "user" : "answer");
  const body = document.createElement("div");
  body.className = "body";
  if (role === "user") body.textContent = text;
  else renderMarkdown(body, text);
  div.append(body);
  $("messages").append(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function showMeta(div, meta) {
  const line = document.createElement("div");
  line.className = "meta";
  const parts = [];
  if (meta.tokens !== null) parts.push(meta.tokens + " tokens");
  if (meta.rate !== null) parts.push(meta.rate.toFixed(1) + " tok/s");
  if (meta.firstToken !== null) parts.push("first token " + Math.round(meta.firstToken) + " ms");
  parts.push("finish: " + meta.finish);
  line.textContent = parts.join(" · ");
  line.dataset.finish = meta.finish;
  if (meta.tokens !== null) line.dataset.tokens = String(meta.tokens);
  div.append(line);
}

function showError(div, message) {
  const line = document.createElement("div");
  line.className = "error";
  line.textContent = message;
  div.append(line);
}

// ---------------------------------------------------------------- one answer

/** The SSE events of ``response`` as parsed JSON objects, until [DONE]. */
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const data = event
        .split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      yield JSON.parse(data);
    }
  }
}

async function send(text) {
  let body;
  try {
    chat.turns.push({ role: "user", content: text });
    body = requestBody();
  } catch (error) {
    chat.turns.pop();
    setStatus("the JSON schema is not valid JSON: " + error.message);
    return;
  }
  addMessage("user", text);
  const div = addMessage("assistant", "");
  const bodyDiv = div.querySelector(".body");
  const controller = new AbortController();
  chat.controller = controller;
  busy(true);
  const started = performance.now();
  let answer = "";
  let firstAt = null;
  let chunks = 0;
  let usage = null;
  let finish = "unfinished";
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (response.status === 401) {
      askForKey(chat.apiKey ? "That key was refused; try another." : "");
      throw new NeedsKey("this server needs an API key; enter it above and send again");
    }
    if (!response.ok) {
      const failure = await response.json().catch(() => ({}));
      throw new Error((failure.error && failure.error.message) || "HTTP " + response.status);
    }
    for await (const event of events(response)) {
      if (event.error) throw new Error(event.error.message || "the server failed");
      if (event.usage) usage = event.usage;
      for (const choice of event.choices || []) {
        const piece = (choice.delta && choice.delta.content) || "";
        if (piece) {
          if (firstAt === null) firstAt = performance.now();
          chunks += 1;
          answer += piece;
          renderMarkdown(bodyDiv, answer);
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
  } catch (error) {
    if (error.name === "AbortError") finish = "stopped";
    else {
      finish = "error";
      showError(div, error.message);
    }
  } finally {
    const ended = performance.now();
    const tokens = usage ? usage.completion_tokens : chunks;
    const decodeSeconds = firstAt === null ? 0 : (ended - firstAt) / 1000;
    const rate = tokens > 1 && decodeSeconds > 0 ? (tokens - 1) / decodeSeconds : null;
    showMeta(div, {
      tokens: finish === "error" && !answer ? null : tokens,
      rate,
      firstToken: firstAt === null ? null : firstAt - started,
      finish,
    });
    // what was produced is kept, also when stopped: the next turn sees it
    if (answer) chat.turns.push({ role: "assistant", content: answer });
    else if (finish === "error") chat.turns.pop(); // the question got no answer: ask again
    chat.controller = null;
    busy(false);
    div.scrollIntoView({ block: "end" });
  }
}

function busy(on) {
  $("send").disabled = on;
  $("stop").disabled = !on;
  setStatus(on ? "answering..." : "");
}

// ---------------------------------------------------------------- wiring

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || chat.controller) return;
  $("prompt").value = "";
  send(text);
});

$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});

$("stop").addEventListener("click", () => {
  if (chat.controller) chat.controller.abort(); // the server frees the row on hang-up
});

$("new-chat").addEventListener("click", () => {
  if (chat.controller) chat.controller.abort();
  chat.turns = [];
  $("messages").replaceChildren();
});

$("api-key-bar").addEventListener("submit", (event) => {
  event.preventDefault();
  chat.apiKey = $("api-key").value.trim();
  sessionStorage.setItem(KEY_STORE, chat.apiKey);
  $("api-key-bar").hidden = true;
  loadModels();
});

loadModels();
