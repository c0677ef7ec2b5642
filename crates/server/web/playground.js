// The playground: chats with the served model over the server's own OpenAI API, streamed. The
// page holds no secret of its own: with --api-key it asks for the key and sends it as a bearer
// token on every API call, exactly as any client must. Conversations and settings live in the
// browser's localStorage only.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = { key: "pagoda.apiKey", chats: "pagoda.conversations", current: "pagoda.current", settings: "pagoda.settings" };
const SETTING_FIELDS = ["mode", "system-prompt", "temperature", "top-p", "top-k", "max-tokens", "seed",
  "json-mode", "json-schema", "tools", "tool-choice", "extra-body"];

const state = {
  model: null,
  chats: JSON.parse(localStorage.getItem(STORE.chats) || "[]"),
  current: localStorage.getItem(STORE.current),
  controller: null,
};

// ---- the API, with the key when one is set -------------------------------------------------

function authHeaders() {
  const key = localStorage.getItem(STORE.key);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

function askForKey(reason) {
  $("key-reason").textContent = reason;
  $("api-key-input").value = localStorage.getItem(STORE.key) || "";
  return new Promise((resolve) => {
    const dialog = $("key-dialog");
    dialog.addEventListener("close", () => resolve(), { once: true });
    dialog.showModal();
  });
}

// A fetch of the API; a 401 asks for the key and tries once more with it.
async function api(path, init = {}) {
  for (let attempt = 0; ; attempt += 1) {
    const headers = { ...(init.headers || {}), ...authHeaders() };
    const response = await fetch(path, { ...init, headers });
    if (response.status !== 401 || attempt > 0) return response;
    const stored = localStorage.getItem(STORE.key);
    await askForKey(stored ? "The server refused this API key; enter the right one." : "This server requires an API key.");
  }
}

async function errorText(response) {
  try {
    const body = await response.json();
    return body.error?.message || JSON.stringify(body);
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

// ---- conversations --------------------------------------------------------------------------

function saveChats() {
  localStorage.setItem(STORE.chats, JSON.stringify(state.chats));
  if (state.current) localStorage.setItem(STORE.current, state.current);
}

function currentChat() {
  let chat = state.chats.find((c) => c.id === state.current);
  if (!chat) {
    chat = { id: `${Date.now()}-${Math.random().toString(36).slice(2, 8)}`, title: "New chat", messages: [] };
    state.chats.unshift(chat);
    state.current = chat.id;
    saveChats();
  }
  return chat;
}

function renderChatList() {
  const list = $("conversations");
  list.replaceChildren();
  for (const chat of state.chats) {
    const li = document.createElement("li");
    li.className = chat.id === state.current ? "active" : "";
    const open = document.createElement("button");
    open.type = "button";
    open.className = "chat-title";
    open.textContent = chat.title;
    open.addEventListener("click", () => { if (!state.controller) { state.current = chat.id; saveChats(); renderAll(); } });
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "ghost small";
    remove.title = "Delete";
    remove.textContent = "×";
    remove.addEventListener("click", () => {
      if (state.controller) return;
      state.chats = state.chats.filter((c) => c.id !== chat.id);
      if (state.current === chat.id) state.current = state.chats[0]?.id || null;
      saveChats();
      renderAll();
    });
    li.append(open, remove);
    list.append(li);
  }
}

// ---- rendering one message ------------------------------------------------------------------

function statsLine(stats) {
  const parts = [];
  if (stats.model) parts.push(stats.model);
  if (stats.ttft_ms != null) parts.push(`TTFT ${Math.round(stats.ttft_ms)} ms`);
  if (stats.tokens_per_s != null) parts.push(`${stats.tokens_per_s.toFixed(1)} tok/s`);
  if (stats.tokens != null) parts.push(`${stats.tokens} tokens`);
  if (stats.finish_reason) parts.push(stats.finish_reason);
  return parts.join(" · ");
}

function renderBody(message, el) {
  const body = el.querySelector(".body");
  body.replaceChildren();
  if (message.reasoning) {
    const details = document.createElement("details");
    details.className = "reasoning";
    details.open = !!message.reasoningOpen;
    details.addEventListener("toggle", () => { message.reasoningOpen = details.open; });
    const summary = document.createElement("summary");
    summary.textContent = message.content || message.tool_calls?.length ? "Reasoning" : "Reasoning…";
    const text = document.createElement("div");
    text.className = "reasoning-text";
    text.textContent = message.reasoning;
    details.append(summary, text);
    body.append(details);
  }
  if (message.role === "assistant" && message.structured) {
    const box = document.createElement("div");
    box.className = "structured";
    let pretty = message.content;
    try { pretty = JSON.stringify(JSON.parse(message.content), null, 2); } catch { /* still streaming */ }
    const label = document.createElement("div");
    label.className = "label";
    label.textContent = "Structured answer (JSON schema)";
    const pre = document.createElement("pre");
    pre.className = "structured-json";
    pre.textContent = pretty;
    box.append(label, pre);
    body.append(box);
  } else if (message.content) {
    const content = document.createElement("div");
    content.className = "content markdown";
    content.innerHTML = message.role === "user" ? Markdown.escapeHtml(message.content).replace(/\n/g, "<br>")
      : Markdown.render(message.content);
    body.append(content);
  }
  for (const call of message.tool_calls || []) {
    const box = document.createElement("div");
    box.className = "tool-call";
    const name = document.createElement("span");
    name.className = "tool-name";
    name.textContent = call.function.name;
    const args = document.createElement("code");
    args.className = "tool-args";
    let pretty = call.function.arguments;
    try { pretty = JSON.stringify(JSON.parse(pretty)); } catch { /* still streaming */ }
    args.textContent = pretty;
    box.append(document.createTextNode("tool call "), name, document.createTextNode("("), args, document.createTextNode(")"));
    body.append(box);
  }
  if (message.error) {
    const err = document.createElement("div");
    err.className = "error-text";
    err.textContent = message.error;
    body.append(err);
  }
  el.querySelector(".stats").textContent = message.stats ? statsLine(message.stats) : "";
}

function messageElement(message, index, chat) {
  const el = document.createElement("div");
  el.className = `message ${message.role}`;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = message.role === "user" ? "You" : "Model";
  const body = document.createElement("div");
  body.className = "body";
  const stats = document.createElement("div");
  stats.className = "stats";
  const actions = document.createElement("div");
  actions.className = "actions";
  if (message.role === "user") {
    const edit = document.createElement("button");
    edit.type = "button";
    edit.className = "ghost small edit";
    edit.textContent = "Edit";
    edit.addEventListener("click", () => startEdit(chat, index, el));
    actions.append(edit);
  } else if (index === chat.messages.length - 1) {
    const again = document.createElement("button");
    again.type = "button";
    again.className = "ghost small regenerate";
    again.textContent = "Regenerate";
    again.addEventListener("click", () => {
      if (state.controller) return;
      chat.messages.pop();
      saveChats();
      generate(chat);
    });
    actions.append(again);
  }
  el.append(who, body, stats, actions);
  // How many streamed chunks brought text: a stream shows token by token, a whole answer in one.
  if (message.role === "assistant") el.dataset.chunks = String(message.chunks || 0);
  renderBody(message, el);
  return el;
}

function startEdit(chat, index, el) {
  if (state.controller) return;
  const area = document.createElement("textarea");
  area.className = "edit-area";
  area.value = chat.messages[index].content;
  const save = document.createElement("button");
  save.type = "button";
  save.className = "save-edit";
  save.textContent = "Save & send";
  save.addEventListener("click", () => {
    chat.messages[index].content = area.value;
    chat.messages.length = index + 1;
    saveChats();
    generate(chat);
  });
  const body = el.querySelector(".body");
  body.replaceChildren(area, save);
  area.focus();
}

function renderMessages() {
  const chat = currentChat();
  const box = $("messages");
  box.replaceChildren(...chat.messages.map((m, i) => messageElement(m, i, chat)));
  box.scrollTop = box.scrollHeight;
}

function renderAll() {
  renderChatList();
  renderMessages();
}

// ---- settings --------------------------------------------------------------------------------

function loadSettings() {
  const saved = JSON.parse(localStorage.getItem(STORE.settings) || "{}");
  for (const id of SETTING_FIELDS) {
    if (!(id in saved)) continue;
    const el = $(id);
    if (el.type === "checkbox") el.checked = saved[id];
    else el.value = saved[id];
  }
}

function saveSettings() {
  const saved = {};
  for (const id of SETTING_FIELDS) {
    const el = $(id);
    saved[id] = el.type === "checkbox" ? el.checked : el.value;
  }
  localStorage.setItem(STORE.settings, JSON.stringify(saved));
  $("mode-badge").textContent = $("mode").value === "completion" ? "completion mode" : "";
}

function parseJsonField(id, what) {
  const text = $(id).value.trim();
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`${what} is not valid JSON: ${e.message}`);
  }
}

// The request body for the chat's next answer, from the settings.
function requestBody(chat) {
  const number = (id, parse) => ($(id).value.trim() === "" ? undefined : parse($(id).value));
  const body = {
    model: state.model || undefined,
    stream: true,
    stream_options: { include_usage: true },
    temperature: number("temperature", parseFloat),
    top_p: number("top-p", parseFloat),
    top_k: number("top-k", (v) => parseInt(v, 10)),
    max_tokens: number("max-tokens", (v) => parseInt(v, 10)),
    seed: number("seed", (v) => parseInt(v, 10)),
  };
  const completion = $("mode").value === "completion";
  if (completion) {
    // The conversation is one document that the model continues.
    body.prompt = (($("system-prompt").value && `${$("system-prompt").value}\n\n`) || "")
      + chat.messages.map((m) => m.content).join("");
  } else {
    const messages = [];
    if ($("system-prompt").value.trim()) messages.push({ role: "system", content: $("system-prompt").value });
    for (const m of chat.messages) {
      const out = { role: m.role, content: m.content || "" };
      if (m.tool_calls?.length) out.tool_calls = m.tool_calls;
      messages.push(out);
    }
    body.messages = messages;
    const tools = parseJsonField("tools", "Tools");
    if (tools) {
      body.tools = tools;
      body.tool_choice = $("tool-choice").value;
    }
  }
  if ($("json-mode").checked) {
    const schema = parseJsonField("json-schema", "The JSON schema");
    if (!schema) throw new Error("JSON-schema mode needs a schema");
    body.response_format = { type: "json_schema", json_schema: { name: "answer", schema, strict: true } };
  }
  Object.assign(body, parseJsonField("extra-body", "Extra request fields") || {});
  return { body, path: completion ? "/v1/completions" : "/v1/chat/completions" };
}

// ---- streaming one answer ---------------------------------------------------------------------

// Yields each `data:` payload of a server-sent event stream.
async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (data) yield data;
    }
  }
}

function applyDelta(message, choice) {
  const delta = choice.delta || {};
  const text = delta.content ?? choice.text ?? "";
  message.content += text;
  const reasoning = delta.reasoning_content ?? delta.reasoning ?? "";
  message.reasoning = (message.reasoning || "") + reasoning;
  for (const call of delta.tool_calls || []) {
    message.tool_calls = message.tool_calls || [];
    const slot = message.tool_calls[call.index ?? message.tool_calls.length]
      || (message.tool_calls[call.index ?? message.tool_calls.length] = { id: "", type: "function", function: { name: "", arguments: "" } });
    if (call.id) slot.id = call.id;
    if (call.function?.name) slot.function.name += call.function.name;
    if (call.function?.arguments) slot.function.arguments += call.function.arguments;
  }
  if (choice.finish_reason) message.stats.finish_reason = choice.finish_reason;
  return text.length + reasoning.length + (delta.tool_calls?.length || 0) > 0;
}

async function generate(chat) {
  $("settings-error").textContent = "";
  let request;
  try {
    request = requestBody(chat);
  } catch (e) {
    $("settings-error").textContent = e.message;
    $("settings").hidden = false;
    return;
  }
  const message = { role: "assistant", content: "", reasoning: "", stats: {}, chunks: 0, structured: $("json-mode").checked };
  chat.messages.push(message);
  if (chat.title === "New chat" && chat.messages[0]) chat.title = chat.messages[0].content.slice(0, 40) || "New chat";
  renderAll();
  const el = $("messages").lastElementChild;
  el.classList.add("streaming");
  const controller = new AbortController();
  state.controller = controller;
  $("send").hidden = true;
  $("stop").hidden = false;
  const started = performance.now();
  let first = null;
  let last = null;
  let pending = false;
  const repaint = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; renderBody(message, el); $("messages").scrollTop = $("messages").scrollHeight; });
  };
  try {
    const response = await api(request.path, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(request.body),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorText(response));
    for await (const data of sseEvents(response)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
      if (chunk.model) message.stats.model = chunk.model;
      let produced = false;
      for (const choice of chunk.choices || []) produced = applyDelta(message, choice) || produced;
      if (produced) {
        const now = performance.now();
        first = first ?? now;
        last = now;
        message.stats.ttft_ms = first - started;
        message.chunks = (message.chunks || 0) + 1;
        el.dataset.chunks = String(message.chunks);
      }
      if (chunk.usage) {
        message.stats.tokens = chunk.usage.completion_tokens;
        if (last > first && chunk.usage.completion_tokens > 1) {
          message.stats.tokens_per_s = (chunk.usage.completion_tokens - 1) / ((last - first) / 1000);
        }
      }
      repaint();
    }
  } catch (e) {
    if (e.name === "AbortError") message.stats.finish_reason = "stopped";
    else message.error = e.message;
  } finally {
    state.controller = null;
    $("send").hidden = false;
    $("stop").hidden = true;
    el.classList.remove("streaming");
    saveChats();
    renderAll();
  }
}

// ---- wiring -----------------------------------------------------------------------------------

async function loadModel() {
  const response = await api("/v1/models");
  if (!response.ok) {
    $("model-name").textContent = `unavailable (${await errorText(response)})`;
    return;
  }
  const list = await response.json();
  state.model = list.data?.[0]?.id || null;
  $("model-name").textContent = state.model || "none";
  // A model without a chat template can only continue text.
  const info = await fetch("/model_info").then((r) => (r.ok ? r.json() : {})).catch(() => ({}));
  if (info.has_chat_template === false) {
    $("mode").querySelector('option[value="chat"]').disabled = true;
    $("mode").value = "completion";
  }
  saveSettings();
}

function send() {
  const text = $("prompt").value;
  if (!text.trim() || state.controller) return;
  const chat = currentChat();
  chat.messages.push({ role: "user", content: text });
  $("prompt").value = "";
  saveChats();
  generate(chat);
}

$("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); }
});
$("stop").addEventListener("click", () => state.controller?.abort());
$("new-chat").addEventListener("click", () => {
  if (state.controller) return;
  state.current = null;
  currentChat();
  renderAll();
});
$("settings-button").addEventListener("click", () => { $("settings").hidden = !$("settings").hidden; });
$("key-button").addEventListener("click", () => askForKey("The API key sent with every request (kept in this browser)."));
$("key-form").addEventListener("submit", () => {
  const key = $("api-key-input").value.trim();
  if (key) localStorage.setItem(STORE.key, key);
});
$("api-key-forget").addEventListener("click", () => { localStorage.removeItem(STORE.key); $("key-dialog").close(); });
for (const id of SETTING_FIELDS) $(id).addEventListener("change", saveSettings);

loadSettings();
renderAll();
loadModel().catch((e) => { $("model-name").textContent = `unavailable (${e.message})`; });
