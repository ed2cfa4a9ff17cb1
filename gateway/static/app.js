/* replgate's web UI: plain JS, no dependencies, no build step.
 *
 * Kernel output is untrusted. Text goes into the DOM only as text nodes (never innerHTML);
 * HTML and SVG go into iframes with sandbox="allow-scripts" and no allow-same-origin, so their
 * scripts run in an opaque origin: no access to this page, its localStorage (the API key) or
 * its cookies. Those frames also inherit the page's Content-Security-Policy, and add their own
 * that forbids any network connection; their scripts run because this page gives them the
 * nonce of its response (they are still inside the sandbox).
 *
 * Governance: a cell a policy holds shows what held it and Approve / Reject buttons. Those call
 * the API with the approver key (kept apart from the API key, also in localStorage) or, without
 * one, with the API key, which the gateway refuses (403) and the cell says so.
 */
"use strict";

(() => {
  const KEY_STORAGE = "replgate.apiKey";
  const APPROVER_STORAGE = "replgate.approverKey";
  const NONCE = document.currentScript ? document.currentScript.nonce : "";
  const FRAME_MAX_HEIGHT = 1600;
  const STATUS_LABELS = {
    pending_approval: "waiting for approval",
    budget_exceeded: "budget exceeded",
  };
  const REFUSED = new Set(["denied", "budget_exceeded"]);
  const LANGUAGE_LABELS = {
    python: "Python", r: "R", javascript: "JavaScript", typescript: "TypeScript", java: "Java",
    bash: "Bash",
  };
  const PLACEHOLDERS = {
    python: "print('hello')", r: "summary(c(1, 2, 3))", javascript: "console.log('hello')",
    typescript: "const n: number = 42; n", java: "System.out.println(\"hello\");",
    bash: "ls -la",
  };
  const MIME_ORDER = [
    "text/html", "image/svg+xml", "image/png", "image/jpeg", "image/gif",
    "text/markdown", "text/latex", "application/json", "text/plain",
  ];

  const $ = (id) => document.getElementById(id);
  const state = {
    key: null,
    approverKey: null,   // a person's key of REPLGATE_APPROVER_KEYS, to decide approvals
    sessions: [],
    waiting: new Map(),  // session id -> how many of its executions wait for approval
    current: null,        // id of the open session
    watch: null,          // the open session's watch socket
    runner: null,         // the open session's ws socket (runs code)
    runnerQueue: [],
    retry: 0,
    retryTimer: null,
    cells: new Map(),     // execution id -> cell
    displays: new Map(),  // display id -> [output element]
    pollTimer: null,
    approvalsAsked: 0,   // sequence number of the latest GET /v1/approvals
    refreshTimer: null,
    transferTimer: null,  // hides the pause/resume bar a moment after its transfer ended
    kernelspecs: null,    // GET /api/kernelspecs, once: the languages of each profile
  };

  // -- small helpers -----------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "text") node.textContent = value;
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function randomId() {
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  function shortId(id) { return id.slice(0, 8); }

  function formatDuration(ms) {
    if (ms === null || ms === undefined) return "";
    if (ms < 1000) return `${Math.round(ms)} ms`;
    if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
    const minutes = Math.floor(ms / 60000);
    return `${minutes} min ${Math.round((ms % 60000) / 1000)} s`;
  }

  function formatSeconds(seconds) {
    const s = Math.max(0, seconds);
    if (s < 10) return `${Number(s.toFixed(1))} s`;
    if (s < 60) return `${Math.floor(s)} s`;
    if (s < 600) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
    if (s < 3600) return `${Math.round(s / 60)} min`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  }

  function clockTime(iso) {
    const date = new Date(iso);
    if (Number.isNaN(date.getTime())) return "";
    return date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  }

  function formatSize(bytes) {
    if (bytes < 1024) return `${bytes} B`;
    const units = ["KB", "MB", "GB"];
    let value = bytes / 1024;
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
    return `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
  }

  function ago(iso) {
    const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    if (!Number.isFinite(seconds)) return "";
    if (seconds < 60) return "just now";
    if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
    if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
    return `${Math.floor(seconds / 86400)} d ago`;
  }

  const TOASTS_SHOWN = 3;

  function toast(message, kind = "info") {
    const node = el("div", { class: `toast toast-${kind}`, text: message, title: message });
    const toasts = $("toasts");
    toasts.append(node);
    // The top bar has room for a few: the oldest go first.
    while (toasts.children.length > TOASTS_SHOWN) toasts.firstElementChild.remove();
    setTimeout(() => node.classList.add("leaving"), 4000);
    setTimeout(() => node.remove(), 4400);
  }

  function saveBlob(blob, filename) {
    const url = URL.createObjectURL(blob);
    const link = el("a", { href: url, download: filename });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  // -- API ---------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, detail) {
      super(typeof detail === "string" ? detail : `request failed (${status})`);
      this.status = status;
    }
  }

  /** Call the API with the API key, or with `key` (an approver's: its 401 signs nobody out). */
  async function api(method, path, { json, body, raw, key } = {}) {
    const headers = { Authorization: `Bearer ${key || state.key}` };
    if (json !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method, headers, body: json !== undefined ? JSON.stringify(json) : body,
      credentials: "omit", cache: "no-store",
    });
    if (response.status === 401 && !key) {
      signOut("The API key was refused. Sign in again.");
      throw new ApiError(401, "unauthorized");
    }
    if (!response.ok) {
      let detail = `${response.status} ${response.statusText}`;
      try {
        const payload = await response.json();
        if (typeof payload.detail === "string") detail = payload.detail;
      } catch (_) { /* not JSON */ }
      throw new ApiError(response.status, detail);
    }
    if (raw) return response;
    if (response.status === 204) return null;
    return response.json();
  }

  function socketUrl(path) {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return `${scheme}//${location.host}${path}?token=${encodeURIComponent(state.key)}`;
  }

  function sessionPath(id) { return `/v1/sessions/${encodeURIComponent(id)}`; }

  // -- sign in -----------------------------------------------------------------------------

  async function start() {
    bindUi();
    window.addEventListener("message", onFrameMessage);
    window.addEventListener("hashchange", () => openFromHash());
    setInterval(tickExpiries, 1000);
    setApproverKey(localStorage.getItem(APPROVER_STORAGE));
    const stored = localStorage.getItem(KEY_STORAGE);
    if (!stored) return showSignIn();
    state.key = stored;
    try {
      await refreshSessions();
    } catch (error) {
      if (error.status === 401) return;
      return showSignIn(`Could not reach the gateway: ${error.message}`);
    }
    showApp();
  }

  function showSignIn(message) {
    $("app").hidden = true;
    $("signin").hidden = false;
    $("signin-error").textContent = message || "";
    $("key-input").focus();
  }

  function showApp() {
    $("signin").hidden = true;
    $("app").hidden = false;
    clearInterval(state.pollTimer);
    state.pollTimer = setInterval(() => {
      if (document.visibilityState === "visible") refreshSessions().catch(() => {});
    }, 5000);
    openFromHash();
  }

  async function signIn(event) {
    event.preventDefault();
    const key = $("key-input").value.trim();
    if (!key) return;
    $("signin-error").textContent = "";
    const response = await fetch("/v1/sessions", {
      headers: { Authorization: `Bearer ${key}` }, credentials: "omit", cache: "no-store",
    }).catch(() => null);
    if (!response) return showSignIn("Could not reach the gateway.");
    if (response.status === 401) {
      // An approver key opens no session, but it may decide approvals: keep it for that.
      const asApprover = await fetch("/v1/approvals", {
        headers: { Authorization: `Bearer ${key}` }, credentials: "omit", cache: "no-store",
      }).catch(() => null);
      if (asApprover && asApprover.ok) {
        setApproverKey(key);
        $("key-input").value = "";
        return showSignIn("That is an approver key: it decides approvals but opens no session. "
          + "It is kept as this browser's approver key; now sign in with an API key.");
      }
      return showSignIn("That key was refused.");
    }
    if (!response.ok) return showSignIn(`The gateway answered ${response.status}.`);
    state.key = key;
    localStorage.setItem(KEY_STORAGE, key);
    $("key-input").value = "";
    renderSessions(await response.json());
    showApp();
  }

  function signOut(message) {
    localStorage.removeItem(KEY_STORAGE);
    state.key = null;
    state.waiting = new Map();
    state.kernelspecs = null;  // another key's tenant may have other profiles
    if (message === undefined) setApproverKey(null);  // signing out on purpose forgets both
    closeApproverPanel();
    closeSession();
    showApproverToggle();
    clearInterval(state.pollTimer);
    renderSessions([]);
    showSignIn(message);
  }

  // -- approver key ------------------------------------------------------------------------

  function setApproverKey(key) {
    state.approverKey = key || null;
    if (key) localStorage.setItem(APPROVER_STORAGE, key);
    else localStorage.removeItem(APPROVER_STORAGE);
    const toggle = $("approver-toggle");
    toggle.classList.toggle("on", Boolean(key));
    toggle.title = key ? "Approve and reject held cells with the saved approver key"
      : "Add an approver key to approve or reject held cells";
    $("approver-label").textContent = key ? "Approver key set" : "Add approver key";
    $("approver-forget").hidden = !key;
    showApproverToggle();
  }

  /** The approver key's button shows once approvals matter here: a saved key or a held cell. */
  function showApproverToggle() {
    $("approver").hidden = !(state.approverKey || state.waiting.size
      || document.querySelector("#transcript .cell-approval"));
  }

  function openApproverPanel() {
    const panel = $("approver-panel");
    panel.hidden = false;
    $("approver-toggle").setAttribute("aria-expanded", "true");
    $("approver-error").textContent = "";
    $("approver-input").value = "";
    $("approver-input").placeholder = state.approverKey ? "saved (paste to replace)" : "approver key";
    $("approver-input").focus();
  }

  function closeApproverPanel() {
    $("approver-panel").hidden = true;
    $("approver-toggle").setAttribute("aria-expanded", "false");
  }

  async function saveApproverKey(event) {
    event.preventDefault();
    const key = $("approver-input").value.trim();
    const error = $("approver-error");
    if (!key) { error.textContent = "Paste a key first."; return; }
    if (key === state.key) {
      error.textContent = "That is the API key you signed in with; approvers have keys of their own.";
      return;
    }
    $("approver-save").disabled = true;
    try {
      // Any key the gateway knows may list approvals: this catches typos, not agent keys.
      await api("GET", "/v1/approvals", { key });
    } catch (failure) {
      error.textContent = failure.status === 401 ? "The gateway does not know that key."
        : `Could not check the key: ${failure.message}`;
      return;
    } finally {
      $("approver-save").disabled = false;
    }
    setApproverKey(key);
    closeApproverPanel();
    toast("Approver key saved in this browser.");
  }

  // -- sessions ----------------------------------------------------------------------------

  /** One refresh for a burst of changes (a history replay holds many). */
  function refreshSoon() {
    if (state.refreshTimer || !state.current) return;
    state.refreshTimer = setTimeout(() => {
      state.refreshTimer = null;
      if (state.key) refreshSessions().catch(() => {});
    }, 250);
  }

  async function refreshSessions() {
    const [sessions] = await Promise.all([api("GET", "/v1/sessions"), refreshApprovals()]);
    renderSessions(sessions);
  }

  /** The tenant's pending approvals: counts per session, and held cells of the open one. */
  async function refreshApprovals() {
    const asked = ++state.approvalsAsked;
    let approvals;
    try {
      approvals = await api("GET", "/v1/approvals");
    } catch (_) {
      return;
    }
    if (asked !== state.approvalsAsked || !Array.isArray(approvals)) return;
    state.waiting = new Map();
    for (const approval of approvals) {
      state.waiting.set(approval.session_id, (state.waiting.get(approval.session_id) || 0) + 1);
      if (approval.session_id !== state.current) continue;
      // A watcher that joins while a cell is held gets no pending_approval frame for it.
      const cell = state.cells.get(approval.execution_id);
      if (cell && !cell.approval && cell.node.dataset.status === "running") {
        holdCell(cell, approval);
      }
    }
    showApproverToggle();
  }

  function renderSessions(sessions) {
    sessions.sort((a, b) => b.created_at.localeCompare(a.created_at));
    state.sessions = sessions;
    $("tenant").textContent = sessions.length ? `tenant ${sessions[0].tenant}` : "";
    const list = $("session-list");
    list.replaceChildren(...sessions.map(sessionItem));
    $("sessions-empty").hidden = sessions.length > 0;
    const current = sessions.find((s) => s.id === state.current);
    if (current) {
      showSessionTitle(current.id, current);
      setStatusBadge($("session-status"), current.status);
      renderBudget(current.budget);
      // Opened while a pause or resume runs: the bar shows before its next frame comes.
      if (current.transfer && $("transfer").hidden) {
        showTransfer({ ...current.transfer, state: "running" });
      }
    }
    showBusy();
  }

  const BUDGET_ITEMS = [
    ["executions_left", (n) => (n === 1 ? "1 run" : `${n} runs`), "executions"],
    ["wall_time_left_s", (s) => `${formatSeconds(s)} wall time`, "wall time"],
    ["cpu_time_left_s", (s) => `${formatSeconds(s)} CPU time`, "CPU time"],
    ["lifetime_left_s", (s) => `${formatSeconds(s)} lifetime`, "lifetime"],
  ];

  /** The open session's budget left, when its policy gives it one. */
  function renderBudget(budget) {
    const node = $("budget");
    const items = [];
    for (const [name, format, label] of BUDGET_ITEMS) {
      const value = budget ? budget[name] : null;
      if (typeof value !== "number" || !Number.isFinite(value)) continue;
      const low = name === "executions_left" ? value <= 3 : value < 60;
      items.push(el("span", {
        class: `budget-item${value <= 0 ? " spent" : low ? " low" : ""}`,
        "data-budget": name, title: `${label} left in this session's budget`,
      }, format(value)));
    }
    node.replaceChildren(...(items.length
      ? [el("span", { class: "budget-label", text: "Budget left" }), ...items] : []));
    node.hidden = items.length === 0;
  }

  /** The name the session's metadata gives it (`metadata.name`), or null. */
  function sessionName(session) {
    const name = session && session.metadata ? session.metadata.name : null;
    return typeof name === "string" && name.trim() ? name.trim() : null;
  }

  /** The rest of the session's metadata as "key: value" texts (values as JSON unless text). */
  function metadataTexts(session) {
    return Object.entries(session.metadata || {})
      .filter(([key]) => !(key === "name" && sessionName(session)))
      .map(([key, value]) => `${key}: ${typeof value === "string" ? value : JSON.stringify(value)}`);
  }

  function showSessionTitle(id, session) {
    const name = sessionName(session);
    const title = $("session-title");
    title.textContent = name || `Session ${shortId(id)}`;
    title.classList.toggle("named", Boolean(name));
    title.title = id;
  }

  function sessionItem(session) {
    const runs = session.execution_count === 1 ? "1 run" : `${session.execution_count} runs`;
    const name = sessionName(session);
    const metadata = metadataTexts(session);
    const remove = el("button", {
      class: "icon-button delete", type: "button", title: "Delete session",
      "aria-label": `Delete session ${name || shortId(session.id)}`, text: "×",
    });
    remove.addEventListener("click", (event) => {
      event.stopPropagation();
      confirmThen(remove, () => deleteSession(session.id, name || shortId(session.id)));
    });
    const item = el("li", {
      class: `session-item${session.id === state.current ? " active" : ""}`,
      "data-session-id": session.id, tabindex: 0, role: "button",
    },
    el("div", { class: "session-line" },
      name ? el("span", { class: "session-name", text: name, title: name })
        : el("span", { class: "session-name mono", text: shortId(session.id) }),
      statusBadge(session.status),
      state.waiting.get(session.id) ? el("span", {
        class: "badge badge-pending_approval waiting",
        title: "Cells of this session wait for a person's approval",
        text: state.waiting.get(session.id) === 1 ? "needs approval"
          : `${state.waiting.get(session.id)} need approval`,
      }) : null),
    el("div", { class: "session-sub muted" },
      `${session.profile} · ${runs} · ${ago(session.created_at)}`),
    // A named session's id (its prefix) goes here, with the rest of its metadata.
    name || metadata.length ? el("div", { class: "session-meta muted", title: metadata.join("\n") || null },
      name ? el("span", { class: "mono", text: shortId(session.id) }) : null,
      `${name && metadata.length ? " · " : ""}${metadata.join(" · ")}`) : null,
    remove);
    item.addEventListener("click", () => { location.hash = `#/s/${session.id}`; });
    item.addEventListener("keydown", (event) => {
      if (event.key === "Enter") location.hash = `#/s/${session.id}`;
    });
    return item;
  }

  function confirmThen(button, action) {
    if (button.dataset.armed) {
      delete button.dataset.armed;
      action();
      return;
    }
    button.dataset.armed = "1";
    button.textContent = "Delete?";
    button.classList.add("armed");
    setTimeout(() => {
      if (!button.isConnected) return;
      delete button.dataset.armed;
      button.textContent = "×";
      button.classList.remove("armed");
    }, 3000);
  }

  function statusBadge(status) {
    return setStatusBadge(el("span"), status);
  }

  function setStatusBadge(node, status) {
    node.className = `badge badge-${status}`;
    node.textContent = status;
    return node;
  }

  async function createSession() {
    const button = $("new-session");
    button.disabled = true;
    try {
      const session = await api("POST", "/v1/sessions", { json: {} });
      await refreshSessions();
      location.hash = `#/s/${session.id}`;
    } catch (error) {
      if (error.status !== 401) toast(`Could not create a session: ${error.message}`, "error");
    } finally {
      button.disabled = false;
    }
  }

  async function deleteSession(id, label) {
    try {
      await api("DELETE", sessionPath(id));
      toast(`Deleted session ${label}`);
    } catch (error) {
      if (error.status !== 401 && error.status !== 404) {
        toast(`Could not delete: ${error.message}`, "error");
      }
    }
    if (id === state.current) location.hash = "";
    await refreshSessions().catch(() => {});
  }

  function openFromHash() {
    if (!state.key) return;
    const match = /^#\/s\/([A-Za-z0-9_-]+)$/.exec(location.hash);
    const id = match ? match[1] : null;
    if (id === state.current) return;
    closeSession();
    if (id) openSession(id);
  }

  function openSession(id) {
    state.current = id;
    $("welcome").hidden = true;
    $("session-view").hidden = false;
    $("files-panel").hidden = false;
    const known = state.sessions.find((s) => s.id === id);
    showSessionTitle(id, known);
    setStatusBadge($("session-status"), known ? known.status : "idle");
    renderBudget(known ? known.budget : null);
    for (const item of document.querySelectorAll(".session-item")) {
      item.classList.toggle("active", item.dataset.sessionId === id);
    }
    connectWatch();
    refreshFiles();
    loadLanguages(known ? known.profile : "default");
    $("code").focus();
  }

  function closeSession() {
    state.current = null;
    clearTimeout(state.retryTimer);
    for (const socket of [state.watch, state.runner]) {
      if (socket) { socket.onclose = null; socket.close(); }
    }
    state.watch = null;
    state.runner = null;
    state.runnerQueue = [];
    clearTimeout(state.transferTimer);
    $("transfer").hidden = true;
    state.cells.clear();
    state.displays.clear();
    for (const cell of document.querySelectorAll("#transcript .cell")) cell.remove();
    $("transcript-empty").hidden = false;
    $("session-view").hidden = true;
    $("budget").hidden = true;
    $("files-panel").hidden = true;
    $("welcome").hidden = false;
    for (const item of document.querySelectorAll(".session-item.active")) {
      item.classList.remove("active");
    }
  }

  function sessionEnded() {
    toast("The session has ended.", "error");
    location.hash = "";
    refreshSessions().catch(() => {});
  }

  // -- watching ----------------------------------------------------------------------------

  function setLive(stateName, text) {
    $("live").dataset.state = stateName;
    $("live-text").textContent = text;
  }

  function connectWatch() {
    const id = state.current;
    setLive("connecting", "Connecting");
    const socket = new WebSocket(socketUrl(`${sessionPath(id)}/watch`));
    state.watch = socket;
    socket.onopen = () => {
      // The watch socket replays the whole history: start from a clean transcript.
      for (const [executionId, cell] of state.cells) {
        if (!cell.pending) { cell.node.remove(); state.cells.delete(executionId); }
      }
      state.displays.clear();
    };
    socket.onmessage = (message) => {
      if (state.watch !== socket) return;
      onWatchFrame(JSON.parse(message.data));
    };
    socket.onclose = (event) => {
      if (state.watch !== socket || state.current !== id) return;
      state.watch = null;
      if (event.code === 4401) return signOut("The API key was refused. Sign in again.");
      if (event.code === 4404) return sessionEnded();
      setLive("offline", "Reconnecting");
      const delay = Math.min(10000, 500 * 2 ** state.retry);
      state.retry += 1;
      state.retryTimer = setTimeout(() => { if (state.current === id) connectWatch(); }, delay);
    };
  }

  function onWatchFrame(frame) {
    switch (frame.type) {
      case "history_end":
        state.retry = 0;
        setLive("live", "Live");
        scrollToEnd(true);
        refreshApprovals();
        return;
      case "lagged":
        toast("Fell behind the session's output; catching up.");
        return;
      case "execution":
        startCell(frame.execution_id, frame.code, frame.started_at);
        return;
      case "transfer":
        showTransfer(frame);
        return;
      default: {
        const cell = state.cells.get(frame.execution_id);
        if (cell) addEvent(cell, frame);
      }
    }
  }

  // -- pause and resume progress -------------------------------------------------------------

  // A pause or resume of the watched session moving its variables: a bar while it runs, its
  // outcome for a moment after it ends.
  function showTransfer(frame) {
    const box = $("transfer");
    const total = frame.total_bytes;
    const pct = total ? Math.min(100, Math.floor((100 * frame.done_bytes) / total)) : 0;
    const verb = frame.operation === "pause" ? "Pausing" : "Resuming";
    box.dataset.operation = frame.operation;
    box.dataset.state = frame.state;
    box.setAttribute("aria-valuenow", String(pct));
    $("transfer-bar").style.width = `${pct}%`;
    clearTimeout(state.transferTimer);
    if (frame.state === "running") {
      const of = total ? ` of ${formatSize(total)}` : "";
      $("transfer-text").textContent = `${verb}: ${formatSize(frame.done_bytes)}${of}`;
    } else {
      const past = frame.operation === "pause" ? "Paused" : "Resumed";
      $("transfer-text").textContent = frame.state === "done"
        ? `${past}: ${formatSize(frame.done_bytes)}` : `${verb} failed`;
      state.transferTimer = setTimeout(() => { box.hidden = true; }, 2000);
      refreshSessions().catch(() => {});
    }
    box.hidden = false;
  }

  // -- running code ------------------------------------------------------------------------

  function runner() {
    if (state.runner && state.runner.readyState <= WebSocket.OPEN) return state.runner;
    const id = state.current;
    const socket = new WebSocket(socketUrl(`${sessionPath(id)}/ws`));
    state.runner = socket;
    socket.onopen = () => {
      for (const message of state.runnerQueue.splice(0)) socket.send(JSON.stringify(message));
    };
    socket.onmessage = (message) => {
      const frame = JSON.parse(message.data);
      // Output arrives on the watch socket; this one only reports refusals.
      if (frame.type === "rejected") {
        const cell = frame.execution_id && state.cells.get(frame.execution_id);
        const detail = typeof frame.detail === "string" ? frame.detail : "invalid request";
        if (cell) rejectCell(cell, detail);
        toast(`Not run: ${detail}`, "error");
      }
    };
    socket.onclose = (event) => {
      if (state.runner === socket) state.runner = null;
      if (event.code === 4401) signOut("The API key was refused. Sign in again.");
      if (event.code === 4404 && state.current === id) sessionEnded();
    };
    return socket;
  }

  function send(message) {
    const socket = runner();
    if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
    else state.runnerQueue.push(message);
  }

  function runCode(event) {
    if (event) event.preventDefault();
    const textarea = $("code");
    const code = textarea.value;
    if (!code.trim() || !state.current) return;
    const id = randomId();
    const language = $("language").value || "python";
    const cell = createCell(id, code, language);
    cell.pending = true;
    setCellStatus(cell, "queued");
    $("transcript").append(cell.node);
    $("transcript-empty").hidden = true;
    send(language === "python" ? { type: "execute", code, id }
      : { type: "execute", code, id, language });
    textarea.value = "";
    autosize();
    scrollToEnd(true);
  }

  async function interrupt() {
    if (!state.current) return;
    try {
      const answer = await api("POST", `${sessionPath(state.current)}/interrupt`);
      if (!answer.interrupted) toast("Nothing was running.");
    } catch (error) {
      if (error.status !== 401) toast(`Could not interrupt: ${error.message}`, "error");
    }
  }

  async function restart() {
    if (!state.current) return;
    const button = $("restart");
    button.disabled = true;
    setStatusBadge($("session-status"), "starting");
    try {
      await api("POST", `${sessionPath(state.current)}/restart`);
      toast("Kernel restarted: variables are gone, files kept.");
    } catch (error) {
      if (error.status !== 401) toast(`Could not restart: ${error.message}`, "error");
    } finally {
      button.disabled = false;
      refreshSessions().catch(() => {});
    }
  }

  async function downloadNotebook() {
    if (!state.current) return;
    try {
      const notebook = await api("GET", `${sessionPath(state.current)}/notebook`);
      const blob = new Blob([JSON.stringify(notebook, null, 1)], { type: "application/x-ipynb+json" });
      saveBlob(blob, `replgate-${shortId(state.current)}.ipynb`);
    } catch (error) {
      if (error.status !== 401) toast(`Could not export: ${error.message}`, "error");
    }
  }

  // -- files -------------------------------------------------------------------------------

  function filePath(path) {
    return path.split("/").map(encodeURIComponent).join("/");
  }

  async function refreshFiles() {
    const id = state.current;
    if (!id) return;
    let files;
    try {
      files = await api("GET", `${sessionPath(id)}/files`);
    } catch (_) {
      return;
    }
    if (id !== state.current) return;
    files.sort((a, b) => a.path.localeCompare(b.path));
    $("file-list").replaceChildren(...files.map((file) => el("li", { class: "file-item" },
      el("button", {
        class: "file-link mono", type: "button", title: `Download ${file.path}`,
        "data-path": file.path, text: file.path,
        onclick: () => downloadFile(file.path),
      }),
      el("span", { class: "file-size muted", text: formatSize(file.size) }))));
    $("files-empty").hidden = files.length > 0;
  }

  async function downloadFile(path) {
    try {
      const response = await api("GET", `${sessionPath(state.current)}/files/${filePath(path)}`,
        { raw: true });
      saveBlob(await response.blob(), path.split("/").pop());
    } catch (error) {
      if (error.status !== 401) toast(`Could not download ${path}: ${error.message}`, "error");
    }
  }

  async function uploadFiles() {
    const input = $("upload-input");
    const id = state.current;
    for (const file of Array.from(input.files)) {
      try {
        await api("PUT", `${sessionPath(id)}/files/${filePath(file.name)}`, { body: file });
        toast(`Uploaded ${file.name}`);
      } catch (error) {
        if (error.status !== 401) toast(`Could not upload ${file.name}: ${error.message}`, "error");
      }
    }
    input.value = "";
    refreshFiles();
  }

  // -- cells -------------------------------------------------------------------------------

  function createCell(id, code, language = "python") {
    const outputs = el("div", { class: "cell-outputs" });
    const status = el("span", { class: "badge" });
    const meta = el("div", { class: "cell-meta" }, status);
    const prompt = el("div", { class: "cell-prompt mono", text: "[ ]" });
    const codeNode = el("pre", { class: "cell-code" });
    const node = el("article", { class: "cell", "data-execution-id": id },
      prompt, el("div", { class: "cell-body" }, codeNode, outputs, meta));
    const cell = {
      id, node, outputs, meta, status, prompt, pending: false, code, codeNode,
      language: null, languageTag: null, stream: null, clearPending: false, displayNodes: [],
    };
    setCellLanguage(cell, language);
    state.cells.set(id, cell);
    return cell;
  }

  /** The cell's language: its tag beside the status (none for Python) and its code's look
   * (Python's highlighted, the others plain). A cell another client ran learns it from its
   * done frame. */
  function setCellLanguage(cell, language) {
    if (cell.language === language) return;
    cell.language = language;
    cell.node.dataset.language = language;
    cell.codeNode.replaceChildren(
      language === "python" ? highlightPython(cell.code) : document.createTextNode(cell.code));
    if (cell.languageTag) cell.languageTag.remove();
    cell.languageTag = language === "python" ? null
      : el("span", { class: "cell-language", text: LANGUAGE_LABELS[language] || language });
    if (cell.languageTag) cell.status.after(cell.languageTag);
  }

  /** The languages the session's profile offers, from the Jupyter API's kernelspecs (one per
   * language of the profile's image), in the picker; the choice is kept where still offered. */
  async function loadLanguages(profile) {
    if (!state.kernelspecs) {
      state.kernelspecs = api("GET", "/api/kernelspecs").catch((error) => {
        state.kernelspecs = null;
        throw error;
      });
    }
    let specs;
    try {
      specs = (await state.kernelspecs).kernelspecs;
    } catch {
      return;  // Python alone, as the picker starts
    }
    const offered = [];
    for (const spec of Object.values(specs)) {
      const replgate = (spec.spec.metadata || {}).replgate || {};
      if (replgate.profile === profile && replgate.language) offered.push(replgate.language);
      if (replgate.profile === profile && replgate.language === "javascript") {
        offered.push("typescript");  // Deno's kernel runs both
      }
    }
    const picker = $("language");
    const chosen = picker.value;
    const ordered = Object.keys(LANGUAGE_LABELS).filter((name) => offered.includes(name));
    picker.replaceChildren(...ordered.map((name) =>
      el("option", { value: name, text: LANGUAGE_LABELS[name] })));
    picker.value = ordered.includes(chosen) ? chosen : "python";
    picker.hidden = ordered.length < 2;
    setPlaceholder();
  }

  function setPlaceholder() {
    $("code").placeholder = PLACEHOLDERS[$("language").value] || PLACEHOLDERS.python;
  }

  function startCell(id, code, startedAt) {
    let cell = state.cells.get(id);
    if (!cell) cell = createCell(id, code);
    cell.pending = false;
    cell.startedAt = startedAt;
    // Started cells come before the ones still waiting to start, in the order they started.
    const transcript = $("transcript");
    const firstPending = Array.from(transcript.querySelectorAll(".cell"))
      .find((node) => node !== cell.node && state.cells.get(node.dataset.executionId)?.pending);
    transcript.insertBefore(cell.node, firstPending || null);
    setCellStatus(cell, "running");
    $("transcript-empty").hidden = true;
    scrollToEnd();
  }

  function setCellStatus(cell, status, text) {
    cell.node.dataset.status = status;
    cell.status.className = `badge badge-${status}`;
    cell.status.textContent = text || STATUS_LABELS[status] || status;
    if (status === "running") cell.prompt.textContent = "[*]";
    showBusy();
  }

  function showBusy() {
    // Between polls, the open session's status follows its cells.
    if (!state.current) return;
    const running = document.querySelector(
      "#transcript .cell:is([data-status=running], [data-status=pending_approval])") !== null;
    const badges = [$("session-status"),
      document.querySelector(`.session-item[data-session-id="${state.current}"] .badge`)];
    for (const badge of badges) {
      if (!badge) continue;
      if (running) setStatusBadge(badge, "busy");
      else if (badge.textContent === "busy") setStatusBadge(badge, "idle");
    }
  }

  function rejectCell(cell, detail) {
    cell.pending = false;
    setCellStatus(cell, "rejected");
    cell.meta.append(el("span", { class: "reason", text: detail }));
  }

  // -- approvals ---------------------------------------------------------------------------

  /** Show the cell as held: what held it, when that ends, and Approve / Reject. `held` is a
   *  pending_approval frame (rule ids) or an approval of GET /v1/approvals (rule matches). */
  function holdCell(cell, held) {
    const id = held.approval_id;
    if (typeof id !== "string") return;
    if (cell.approval && cell.approval.id === id) {
      if (!cell.approval.decided) showRules(cell, held.rules);
      return;
    }
    const expires = el("span", { class: "approval-expires", "data-expires": held.expires_at,
      title: `Expires at ${held.expires_at}` });
    const comment = el("input", {
      class: "approval-comment", type: "text", maxlength: 2000, "aria-label": "Comment",
      placeholder: "Comment (optional)", autocomplete: "off", spellcheck: "false",
    });
    const approve = el("button", { class: "button small approve", type: "button", text: "Approve" });
    const reject = el("button", { class: "button small reject", type: "button", text: "Reject" });
    const error = el("div", { class: "approval-error", role: "alert", hidden: true });
    const node = el("div", { class: "cell-approval", "data-state": "pending",
      "data-approval-id": id },
    el("div", { class: "approval-head" },
      el("span", { class: "approval-icon", "aria-hidden": "true" }),
      el("strong", { class: "approval-title", text: "Waiting for approval" }),
      expires),
    el("ul", { class: "approval-rules" }),
    el("div", { class: "approval-actions" }, comment, reject, approve),
    error);
    cell.approval = { id, node, decided: false, approve, reject, comment, error, rules: [] };
    approve.addEventListener("click", () => decide(cell, "approve"));
    reject.addEventListener("click", () => decide(cell, "reject"));
    cell.node.querySelector(".cell-approval")?.remove();
    cell.outputs.before(node);
    showRules(cell, held.rules);
    updateExpiry(expires);
    setCellStatus(cell, "pending_approval");
    showApproverToggle();
    // The event names the rules; the approval itself has their lines and messages.
    if (!(held.rules || []).some((rule) => rule && typeof rule === "object")) {
      api("GET", `/v1/approvals/${encodeURIComponent(id)}`)
        .then((approval) => { if (cell.approval && cell.approval.id === id) showRules(cell, approval.rules); })
        .catch(() => {});
    }
    refreshSoon();
  }

  /** Rules as ids (from the event) or as matches {rule, line, matched, message}. */
  function showRules(cell, rules) {
    if (!Array.isArray(rules) || !rules.length) return;
    const detailed = rules.filter((rule) => rule && typeof rule === "object");
    if (!detailed.length && cell.approval.rules.length) return;  // keep the details we have
    cell.approval.rules = rules;
    const list = cell.approval.node.querySelector(".approval-rules");
    list.replaceChildren(...rules.map((rule) => {
      if (typeof rule === "string") {
        return el("li", {}, el("span", { class: "rule-id mono", text: rule }));
      }
      const where = [Number.isInteger(rule.line) ? `line ${rule.line}` : null,
        typeof rule.matched === "string" ? rule.matched : null].filter(Boolean).join(" · ");
      return el("li", {},
        el("span", { class: "rule-id mono", text: String(rule.rule) }),
        where ? el("span", { class: "rule-where mono", text: where }) : null,
        typeof rule.message === "string" && rule.message
          ? el("span", { class: "rule-message", text: rule.message }) : null);
    }));
  }

  function updateExpiry(node) {
    const left = (Date.parse(node.dataset.expires) - Date.now()) / 1000;
    if (!Number.isFinite(left)) { node.textContent = ""; return; }
    const at = clockTime(node.dataset.expires);
    node.textContent = left > 0 ? `expires in ${formatSeconds(left)} (at ${at})`
      : `expired at ${at}`;
    node.classList.toggle("soon", left < 60);
  }

  function tickExpiries() {
    for (const node of document.querySelectorAll(
      "#transcript .cell-approval[data-state=pending] .approval-expires")) updateExpiry(node);
  }

  async function decide(cell, verb) {
    const held = cell.approval;
    if (!held || held.decided) return;
    const { approve, reject, comment, error } = held;
    approve.disabled = true;
    reject.disabled = true;
    (verb === "approve" ? approve : reject).textContent =
      verb === "approve" ? "Approving…" : "Rejecting…";
    error.hidden = true;
    const text = comment.value.trim();
    const usingApprover = Boolean(state.approverKey);
    try {
      const answer = await api("POST", `/v1/approvals/${encodeURIComponent(held.id)}/${verb}`, {
        json: text ? { comment: text } : {}, key: state.approverKey || undefined,
      });
      // The approval frame on the watch socket says the same; whichever comes first shows.
      showDecision(cell, { approval_id: held.id, decision: answer.status,
        by: answer.decided_by, at: answer.decided_at, comment: answer.comment });
    } catch (failure) {
      if (failure.status === 401 && !usingApprover) return;  // signed out
      approve.disabled = false;
      reject.disabled = false;
      approve.textContent = "Approve";
      reject.textContent = "Reject";
      showApprovalError(cell, failure, usingApprover, verb);
    }
  }

  function showApprovalError(cell, failure, usingApprover, verb) {
    const { error } = cell.approval;
    const parts = [];
    if (failure.status === 403) {
      parts.push(el("span", { text: usingApprover
        ? "The saved approver key may not decide this approval. "
        : `Only an approver can ${verb} a held cell, and you are signed in with an agent's key. ` }));
      parts.push(el("button", { class: "link-button", type: "button",
        text: usingApprover ? "Change the approver key" : "Add an approver key",
        onclick: () => openApproverPanel() }));
      parts.push(el("span", { class: "approval-detail", text: `The gateway said: ${failure.message}` }));
    } else if (failure.status === 401) {
      parts.push(el("span", { text: "The gateway refused the saved approver key. " }));
      parts.push(el("button", { class: "link-button", type: "button", text: "Change it",
        onclick: () => openApproverPanel() }));
    } else if (failure.status === 409) {
      parts.push(el("span", { text: `Already decided: ${failure.message}.` }));
    } else if (failure.status === 404) {
      parts.push(el("span", { text: usingApprover
        ? "The saved approver key cannot see this approval: it is another tenant's key, or the "
          + "approval is gone (withdrawn, or the gateway restarted)."
        : "This approval is gone: it was withdrawn, or the gateway restarted." }));
    } else {
      parts.push(el("span", { text: `Could not ${verb}: ${failure.message}` }));
    }
    error.replaceChildren(...parts);
    error.hidden = false;
  }

  const DECISIONS = {
    approved: "Approved",
    rejected: "Rejected",
    expired: "Expired",
  };

  /** The approval's decision, who made it and when, in place of the buttons. */
  function showDecision(cell, frame) {
    const held = cell.approval;
    if (held && held.id !== frame.approval_id) return;
    if (!held) {  // joined after the hold: show the decision alone
      holdCell(cell, { approval_id: frame.approval_id, rules: [], expires_at: frame.at });
      return showDecision(cell, frame);
    }
    const decision = DECISIONS[frame.decision] ? frame.decision : "expired";
    if (held.decided === decision) return;
    held.decided = decision;
    const node = held.node;
    node.dataset.state = decision;
    const when = clockTime(frame.at);
    const says = decision === "expired"
      ? `Expired${when ? ` at ${when}` : ""} without a decision`
      : `${DECISIONS[decision]}${frame.by ? ` by ${frame.by}` : ""}${when ? ` at ${when}` : ""}`;
    const title = node.querySelector(".approval-title");
    title.textContent = says;
    if (frame.at) title.title = frame.at;
    const expires = node.querySelector(".approval-expires");
    expires.replaceChildren();
    expires.removeAttribute("title");
    if (frame.comment) expires.append(el("q", { class: "approval-comment-text", text: frame.comment }));
    node.querySelector(".approval-actions")?.remove();
    held.error.remove();
    if (decision === "approved" && cell.node.dataset.status === "pending_approval") {
      setCellStatus(cell, "running");
    }
    refreshSoon();
  }

  function withdrawApproval(cell) {
    const held = cell.approval;
    held.decided = "withdrawn";
    held.node.dataset.state = "withdrawn";
    held.node.querySelector(".approval-title").textContent = "No longer waiting: it ended before a decision";
    held.node.querySelector(".approval-expires").replaceChildren();
    held.node.querySelector(".approval-expires").removeAttribute("title");
    held.node.querySelector(".approval-actions")?.remove();
    held.error.remove();
  }

  function addEvent(cell, frame) {
    const nearBottom = isNearBottom();
    if (cell.clearPending && frame.type !== "done" && frame.type !== "clear_output") {
      clearCellOutputs(cell);
    }
    switch (frame.type) {
      case "stdout":
      case "stderr":
        appendStream(cell, frame.type, frame.text);
        break;
      case "display":
      case "result":
        appendRich(cell, frame);
        break;
      case "update_display":
        updateDisplay(frame);
        break;
      case "clear_output":
        if (frame.wait) cell.clearPending = true;
        else clearCellOutputs(cell);
        break;
      case "error":
        appendError(cell, frame);
        break;
      case "pending_approval":
        holdCell(cell, frame);
        break;
      case "approval":
        showDecision(cell, frame);
        break;
      case "done":
        if (frame.language) setCellLanguage(cell, frame.language);
        finishCell(cell, frame);
        break;
      default:
        return;
    }
    scrollToEnd(nearBottom);
  }

  function clearCellOutputs(cell) {
    cell.outputs.replaceChildren();
    cell.stream = null;
    cell.clearPending = false;
  }

  function appendStream(cell, name, text) {
    if (!cell.stream || cell.stream.name !== name || cell.outputs.lastChild !== cell.stream.node) {
      const node = el("pre", { class: `output stream ${name}` });
      cell.outputs.append(node);
      cell.stream = { name, node, text: "" };
    }
    cell.stream.text += text;
    // A final newline would show as an empty last line.
    renderAnsi(fixCarriageReturns(cell.stream.text).replace(/\n$/, ""), cell.stream.node);
  }

  function appendError(cell, frame) {
    cell.stream = null;
    const traceback = Array.isArray(frame.traceback) ? frame.traceback.map(String) : [];
    const fold = foldTraceback(traceback);
    let node;
    if (fold) {
      node = el("div", { class: "output error folded" },
        ansiPre("error-line", fold.exception),
        el("details", { class: "error-earlier" },
          el("summary", { text: `${fold.folded} earlier frames` }),
          ansiPre("error-frames", fold.earlier.join("\n"))),
        ansiPre("error-frames", fold.last.join("\n")));
    } else {
      node = el("pre", { class: "output error" });
      renderAnsi(traceback.length ? traceback.join("\n") : `${frame.ename}: ${frame.evalue}`, node);
    }
    cell.outputs.append(node);
    cell.errorNode = node;
  }

  function ansiPre(className, text) {
    const node = el("pre", { class: className });
    renderAnsi(text.replace(/\n+$/, ""), node);
    return node;
  }

  // Entries of IPython's traceback list: a frame (or a run of frames it skipped), and a frame
  // of the user's own cell (IPython 8, then 7's two spellings).
  const FRAME_ENTRY = /^\s*(?:File |Cell |Input |<ipython-input-|\[\.\.\. skipping)/;
  const USER_FRAME_ENTRY = /^\s*(?:Cell In\[|Input In \[|<ipython-input-)/;
  // A recursion's repeats as one entry: "[... skipping similar frames: f at line 4 (5 times)]".
  const SKIPPED_ENTRY = /^\s*\[\.\.\. skipping.*\((\d+) times?\)/;
  const TRACEBACK_KEEP = 2;   // frames a long traceback shows under its exception line...
  const TRACEBACK_REACH = 4;  // ...or up to this many, when that reaches the user's own cell

  function framesIn(entry) {
    if (!FRAME_ENTRY.test(entry)) return 0;
    const skipped = SKIPPED_ENTRY.exec(entry);
    return skipped ? Number(skipped[1]) : 1;
  }

  /** A long traceback read from its end: the exception line, the last frames, and the earlier
   *  entries to fold (headers, outer frames, chained exceptions); null when it is short. */
  function foldTraceback(entries) {
    const frames = entries.slice(0, -1);
    const plain = frames.map((entry) => entry.replace(ANSI_RE, ""));
    let start = frames.length - TRACEBACK_KEEP;
    // A library's KeyError ends in its own frames: keep the user's line that led there.
    const user = plain.findLastIndex((text) => USER_FRAME_ENTRY.test(text));
    if (user >= frames.length - TRACEBACK_REACH) start = Math.min(start, user);
    const folded = plain.slice(0, Math.max(0, start)).reduce((n, text) => n + framesIn(text), 0);
    if (folded < 2) return null;
    return { exception: entries[entries.length - 1], earlier: frames.slice(0, start),
      last: frames.slice(start), folded };
  }

  function appendRich(cell, frame) {
    cell.stream = null;
    const node = el("div", { class: `output rich ${frame.type}` });
    if (frame.type === "result") node.append(el("div", { class: "out-prompt mono", text: "Out" }));
    const body = el("div", { class: "rich-body" });
    node.append(body);
    renderMime(body, frame.data || {}, frame.metadata || {});
    if (frame.chart && frame.data && frame.data["image/png"]) {
      const table = chartTable(frame.chart);
      if (table) body.append(table);  // under the image, in the output's own column
    }
    cell.outputs.append(node);
    if (frame.display_id) {
      const list = state.displays.get(frame.display_id) || [];
      list.push(body);
      state.displays.set(frame.display_id, list);
    }
  }

  function updateDisplay(frame) {
    for (const body of state.displays.get(frame.display_id) || []) {
      body.replaceChildren();
      renderMime(body, frame.data || {}, frame.metadata || {});
    }
  }

  function finishCell(cell, frame) {
    cell.pending = false;
    setCellStatus(cell, frame.status);
    if (cell.approval && !cell.approval.decided) withdrawApproval(cell);
    const refused = REFUSED.has(frame.status);
    if (refused && cell.errorNode && cell.outputs.contains(cell.errorNode)) {
      // The gateway refused it (a status the kernel cannot give): its error is the reason.
      cell.errorNode.classList.add("refusal");
      cell.errorNode.dataset.status = frame.status;
    }
    const count = frame.execution_count;
    cell.prompt.textContent = count === null || count === undefined ? "[ ]" : `[${count}]`;
    cell.meta.querySelectorAll(".meta-extra").forEach((node) => node.remove());
    cell.meta.append(el("span", { class: "duration meta-extra", text: formatDuration(frame.duration_ms) }));
    if (frame.truncated) {
      cell.meta.append(el("span", {
        class: "notice truncated meta-extra",
        text: "Output truncated: the full text is in the file named in the output.",
      }));
    }
    if (frame.restarted) {
      cell.meta.append(el("span", { class: "notice restarted meta-extra",
        text: "Kernel restarted: variables were lost, files kept." }));
    }
    if (frame.reason && !(refused && cell.errorNode)) {
      cell.meta.append(el("span", { class: "reason meta-extra", text: frame.reason }));
    }
    cell.node.querySelectorAll(".touched").forEach((node) => node.remove());
    if (frame.files && frame.files.length) cell.outputs.after(touchedFiles(frame.files));
    if (state.current) {
      refreshFiles();
      refreshSessions().catch(() => {});
    }
  }

  // A cell's touched files: created and modified ones download on click, deleted ones are
  // only named.
  function touchedFiles(files) {
    return el("div", { class: "touched" },
      el("span", { class: "touched-title muted", text: "Files" }),
      el("ul", { class: "touched-list" }, ...files.map((file) => el("li",
        { class: `touched-file ${file.change}` },
        file.change === "deleted"
          ? el("span", { class: "mono", text: file.path })
          : el("button", {
            class: "touched-link mono", type: "button", title: `Download ${file.path}`,
            "data-path": file.path, text: file.path, onclick: () => downloadFile(file.path),
          }),
        el("span", { class: "muted", text: file.change === "deleted"
          ? "deleted" : `${file.change}, ${formatSize(file.size)}` })))));
  }

  // -- charts as data ----------------------------------------------------------------------

  const CHART_ROWS = 200;

  function chartColumns(chart) {
    const x = chart.x_label || "x";
    const y = chart.y_label || "y";
    switch (chart.type) {
      case "line":
      case "scatter":
        return [["series", x, y], (e) => (e.points || []).map((p) => [e.label, p[0], p[1]])];
      case "bar":
        return [["label", "group", y], (e) => [[e.label, e.group, e.value]]];
      case "pie":
        return [["label", "angle", "share"],
          (e) => [[e.label, e.angle, `${((e.angle / 360) * 100).toFixed(1)}%`]]];
      case "box_and_whisker":
        return [["label", "min", "Q1", "median", "Q3", "max", "outliers"],
          (e) => [[e.label, e.min, e.first_quartile, e.median, e.third_quartile, e.max,
            (e.outliers || []).join(", ")]]];
      default:
        return null;
    }
  }

  function chartCell(value) {
    if (typeof value === "number") return String(Number(value.toPrecision(6)));
    return value === null || value === undefined ? "" : String(value);
  }

  // One chart's data as a table; a superchart as one table per part (null when nothing).
  // Folded: the image says it first, and an open table of hundreds of rows would push the
  // next cell out of sight. A superchart's parts open with it (one click shows them all).
  function chartTable(chart, part = false) {
    if (chart.type === "superchart") {
      const parts = (chart.elements || []).map((element) => chartTable(element, true))
        .filter(Boolean);
      if (!parts.length) return null;
      return el("details", { class: "chart-data" },
        el("summary", { text: `Chart data: ${chart.title || "subplots"} (${parts.length} parts)` }),
        ...parts);
    }
    const columns = chartColumns(chart);
    if (!columns || !(chart.elements || []).length) return null;
    const [heads, rowsOf] = columns;
    const rows = chart.elements.flatMap(rowsOf);
    const shown = rows.slice(0, CHART_ROWS);
    const table = el("table", { class: "chart-table" },
      el("thead", {}, el("tr", {}, ...heads.map((h) => el("th", { text: h })))),
      el("tbody", {}, ...shown.map((row) => el("tr", {},
        ...row.map((value) => el("td", { text: chartCell(value) }))))));
    const title = `${chart.type.replace(/_/g, " ")}${chart.title ? `: ${chart.title}` : ""}`;
    const count = rows.length === 1 ? "1 row" : `${rows.length} rows`;
    return el("details", { class: "chart-data", open: part },
      el("summary", { text: `Chart data (${title}) · ${count}` }), table,
      rows.length > shown.length
        ? el("p", { class: "muted", text: `${rows.length - shown.length} more rows not shown` })
        : null);
  }

  // -- rich output -------------------------------------------------------------------------

  function renderMime(container, data, metadata) {
    const mime = MIME_ORDER.find((type) => type in data);
    if (!mime) {
      container.append(el("pre", { class: "output-plain muted",
        text: `[output of type ${Object.keys(data).join(", ") || "none"} not shown]` }));
      return;
    }
    const value = data[mime];
    const meta = metadata[mime] || {};
    if (mime === "text/html") {
      container.append(outputFrame(String(value), "html"));
    } else if (mime === "image/svg+xml") {
      container.append(outputFrame(String(value), "svg"));
    } else if (mime.startsWith("image/")) {
      const img = el("img", { class: "output-image", alt: "image output" });
      img.src = `data:${mime};base64,${String(value).replace(/\s+/g, "")}`;
      if (Number.isFinite(meta.width)) img.width = meta.width;
      if (Number.isFinite(meta.height)) img.height = meta.height;
      container.append(img);
    } else if (mime === "application/json") {
      container.append(el("pre", { class: "output-plain", text: JSON.stringify(value, null, 2) }));
    } else {
      const pre = el("pre", { class: "output-plain" });
      renderAnsi(String(value), pre);
      container.append(pre);
    }
  }

  const FRAME_STYLE = `
    html,body{margin:0;padding:0;background:#fff;color:#1f2430;
      font:13px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
    body{overflow-x:auto;overflow-y:hidden}
    #replgate-root{display:flow-root;padding:2px 1px}
    table{border-collapse:collapse;border:none;font-size:12px;font-variant-numeric:tabular-nums;margin:2px 0}
    th,td{padding:4px 10px;text-align:right;border:none;white-space:nowrap}
    thead th{border-bottom:1px solid #cfd4dd;font-weight:600}
    tbody th{font-weight:600}
    tbody tr:nth-child(odd){background:#f6f7f9}
    tbody tr:hover{background:#eef1fb}
    img,svg{max-width:100%;height:auto}`;

  const FRAME_CSP = [
    "default-src 'none'", `script-src 'nonce-${NONCE}'`, "style-src 'unsafe-inline'",
    "img-src data: blob:", "font-src data:", "media-src data: blob:",
    "connect-src 'none'", "form-action 'none'", "base-uri 'none'",
  ].join("; ");

  // Inside the frame: report the content's height to the page (the only thing it may say).
  const FRAME_SCRIPT = `(function(){
    var root=document.getElementById("replgate-root"),last=-1;
    function post(){var h=Math.ceil(root.getBoundingClientRect().height)
      +(document.body.scrollWidth>document.body.clientWidth?14:0);
      if(h!==last){last=h;parent.postMessage({replgateFrameHeight:h},"*");}}
    new ResizeObserver(post).observe(root);addEventListener("load",post);post();})();`;

  function outputFrame(markup, kind) {
    // Parse inertly (no script runs, nothing loads), give the content's scripts the nonce so
    // they may run inside the sandbox, and serialise it into the frame's document.
    const parsed = new DOMParser().parseFromString(
      kind === "svg" ? `<body>${markup}</body>` : markup, "text/html");
    for (const script of parsed.querySelectorAll("script")) script.setAttribute("nonce", NONCE);
    const content = parsed.head.innerHTML + parsed.body.innerHTML;
    const doc = `<!doctype html><html><head><meta charset="utf-8">`
      + `<meta http-equiv="Content-Security-Policy" content="${FRAME_CSP}">`
      + `<style>${FRAME_STYLE}</style></head><body><div id="replgate-root">${content}</div>`
      + `<script nonce="${NONCE}">${FRAME_SCRIPT}</script></body></html>`;
    const frame = el("iframe", {
      class: `output-frame ${kind}`, sandbox: "allow-scripts", referrerpolicy: "no-referrer",
      title: kind === "svg" ? "SVG output" : "HTML output", loading: "eager",
    });
    frame.srcdoc = doc;
    frame.style.height = "40px";
    return frame;
  }

  function onFrameMessage(event) {
    // Only height reports from our own output frames are heeded, and only as a number.
    const height = event.data && event.data.replgateFrameHeight;
    if (typeof height !== "number" || !Number.isFinite(height)) return;
    for (const frame of document.querySelectorAll("iframe.output-frame")) {
      if (frame.contentWindow === event.source) {
        frame.style.height = `${Math.max(16, Math.min(FRAME_MAX_HEIGHT, height))}px`;
        frame.classList.toggle("capped", height > FRAME_MAX_HEIGHT);
        if (frame.classList.contains("capped")) frame.setAttribute("scrolling", "yes");
        return;
      }
    }
  }

  // -- ANSI escape codes -> styled spans ---------------------------------------------------

  const ANSI_NAMES = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"];
  // eslint-disable-next-line no-control-regex
  const ANSI_RE = /\x1b\[([0-9;:?]*)([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]/g;

  function ansi256(n) {
    if (n < 16) return { name: (n < 8 ? "" : "bright-") + ANSI_NAMES[n % 8] };
    if (n < 232) {
      const c = n - 16;
      const level = (v) => (v === 0 ? 0 : 55 + v * 40);
      return { rgb: [level(Math.floor(c / 36)), level(Math.floor(c / 6) % 6), level(c % 6)] };
    }
    const grey = 8 + (n - 232) * 10;
    return { rgb: [grey, grey, grey] };
  }

  function applySgr(style, params) {
    const codes = params === "" ? [0] : params.split(/[;:]/).map((p) => (p === "" ? 0 : Number(p)));
    for (let i = 0; i < codes.length; i += 1) {
      const code = codes[i];
      if (code === 0) Object.assign(style, { fg: null, bg: null, bold: false, dim: false,
        italic: false, underline: false, inverse: false });
      else if (code === 1) style.bold = true;
      else if (code === 2) style.dim = true;
      else if (code === 3) style.italic = true;
      else if (code === 4) style.underline = true;
      else if (code === 7) style.inverse = true;
      else if (code === 22) { style.bold = false; style.dim = false; }
      else if (code === 23) style.italic = false;
      else if (code === 24) style.underline = false;
      else if (code === 27) style.inverse = false;
      else if (code >= 30 && code <= 37) style.fg = { name: ANSI_NAMES[code - 30] };
      else if (code === 39) style.fg = null;
      else if (code >= 40 && code <= 47) style.bg = { name: ANSI_NAMES[code - 40] };
      else if (code === 49) style.bg = null;
      else if (code >= 90 && code <= 97) style.fg = { name: `bright-${ANSI_NAMES[code - 90]}` };
      else if (code >= 100 && code <= 107) style.bg = { name: `bright-${ANSI_NAMES[code - 100]}` };
      else if (code === 38 || code === 48) {
        let color = null;
        if (codes[i + 1] === 5 && i + 2 < codes.length) {
          color = ansi256(codes[i + 2] & 255);
          i += 2;
        } else if (codes[i + 1] === 2 && i + 4 < codes.length) {
          color = { rgb: codes.slice(i + 2, i + 5).map((v) => Math.max(0, Math.min(255, v | 0))) };
          i += 4;
        }
        if (code === 38) style.fg = color; else style.bg = color;
      }
    }
  }

  function styledSpan(text, style) {
    let { fg, bg } = style;
    if (style.inverse) [fg, bg] = [bg || { name: "inverse-fg" }, fg || { name: "inverse-bg" }];
    const classes = [];
    const span = document.createElement("span");
    if (fg && fg.name) classes.push(`ansi-fg-${fg.name}`);
    if (bg && bg.name) classes.push(`ansi-bg-${bg.name}`);
    if (fg && fg.rgb) span.style.color = `rgb(${fg.rgb.join(",")})`;
    if (bg && bg.rgb) span.style.backgroundColor = `rgb(${bg.rgb.join(",")})`;
    if (style.bold) classes.push("ansi-bold");
    if (style.dim) classes.push("ansi-dim");
    if (style.italic) classes.push("ansi-italic");
    if (style.underline) classes.push("ansi-underline");
    span.className = classes.join(" ");
    span.textContent = text;
    return span;
  }

  function isPlain(style) {
    return !style.fg && !style.bg && !style.bold && !style.dim && !style.italic
      && !style.underline && !style.inverse;
  }

  /** Render text with ANSI SGR colours into `target` as text nodes and spans (never HTML). */
  function renderAnsi(text, target) {
    const style = { fg: null, bg: null, bold: false, dim: false, italic: false,
      underline: false, inverse: false };
    const parts = [];
    let last = 0;
    const emit = (chunk) => {
      if (!chunk) return;
      parts.push(isPlain(style) ? document.createTextNode(chunk) : styledSpan(chunk, style));
    };
    ANSI_RE.lastIndex = 0;
    for (let match = ANSI_RE.exec(text); match; match = ANSI_RE.exec(text)) {
      emit(text.slice(last, match.index));
      last = ANSI_RE.lastIndex;
      if (match[2] === "m") applySgr(style, match[1]);
    }
    emit(text.slice(last));
    target.replaceChildren(...parts);
  }

  function fixCarriageReturns(text) {
    // As Jupyter does: a bare \r returns to the start of the line, overwriting it.
    return text.replace(/\r+\n/g, "\n").replace(/^.*\r+/gm, "");
  }

  // -- Python highlighting (as spans; the code is only ever text) --------------------------

  const PY_KEYWORDS = new Set(("False None True and as assert async await break class continue "
    + "def del elif else except finally for from global if import in is lambda nonlocal not or "
    + "pass raise return try while with yield match case").split(" "));
  const PY_BUILTINS = new Set(("print len range open int str float list dict set tuple bool "
    + "type isinstance enumerate zip map filter sorted sum min max abs any all repr super "
    + "object Exception ValueError TypeError KeyError RuntimeError self").split(" "));
  const PY_TOKEN = new RegExp([
    /(#[^\n]*)/.source,
    /((?:\b[rRbBuUfF]{1,2})?(?:'''[\s\S]*?(?:'''|$(?![\s\S]))|"""[\s\S]*?(?:"""|$(?![\s\S]))|'(?:\\.|[^'\\\n])*'?|"(?:\\.|[^"\\\n])*"?))/.source,
    /(\b(?:0[xXoObB][\da-fA-F_]+|\d[\d_]*(?:\.[\d_]*)?(?:[eE][+-]?\d+)?j?)\b)/.source,
    /(@[A-Za-z_][\w.]*)/.source,
    /([A-Za-z_]\w*)/.source,
  ].join("|"), "g");

  function highlightPython(code) {
    const fragment = document.createDocumentFragment();
    let last = 0;
    let previousWord = "";
    const span = (cls, text) => fragment.append(el("span", { class: cls, text }));
    PY_TOKEN.lastIndex = 0;
    for (let m = PY_TOKEN.exec(code); m; m = PY_TOKEN.exec(code)) {
      if (m[0] === "") { PY_TOKEN.lastIndex += 1; continue; }
      fragment.append(document.createTextNode(code.slice(last, m.index)));
      last = PY_TOKEN.lastIndex;
      if (m[1]) span("tok-comment", m[1]);
      else if (m[2]) span("tok-string", m[2]);
      else if (m[3]) span("tok-number", m[3]);
      else if (m[4]) span("tok-decorator", m[4]);
      else {
        const word = m[5];
        if (previousWord === "def" || previousWord === "class") span("tok-def", word);
        else if (PY_KEYWORDS.has(word)) span("tok-keyword", word);
        else if (PY_BUILTINS.has(word)) span("tok-builtin", word);
        else fragment.append(document.createTextNode(word));
        previousWord = word;
        continue;
      }
      previousWord = "";
    }
    fragment.append(document.createTextNode(code.slice(last)));
    return fragment;
  }

  // -- layout ------------------------------------------------------------------------------

  function isNearBottom() {
    const t = $("transcript");
    return t.scrollHeight - t.scrollTop - t.clientHeight < 120;
  }

  function scrollToEnd(force) {
    const t = $("transcript");
    if (force || isNearBottom()) t.scrollTop = t.scrollHeight;
  }

  function autosize() {
    const textarea = $("code");
    textarea.style.height = "auto";
    textarea.style.height = `${Math.min(320, Math.max(72, textarea.scrollHeight + 2))}px`;
  }

  function onCodeKey(event) {
    if (event.key === "Enter" && (event.shiftKey || event.ctrlKey || event.metaKey)) {
      runCode(event);
    } else if (event.key === "Tab" && !event.shiftKey) {
      event.preventDefault();
      const t = event.target;
      t.setRangeText("    ", t.selectionStart, t.selectionEnd, "end");
      autosize();
    }
  }

  function bindUi() {
    $("signin-form").addEventListener("submit", signIn);
    $("signout").addEventListener("click", () => signOut());
    $("new-session").addEventListener("click", createSession);
    $("composer").addEventListener("submit", runCode);
    $("code").addEventListener("keydown", onCodeKey);
    $("code").addEventListener("input", autosize);
    $("language").addEventListener("change", setPlaceholder);
    $("interrupt").addEventListener("click", interrupt);
    $("restart").addEventListener("click", restart);
    $("download-notebook").addEventListener("click", downloadNotebook);
    $("upload-input").addEventListener("change", uploadFiles);
    $("approver-toggle").addEventListener("click", () => {
      if ($("approver-panel").hidden) openApproverPanel(); else closeApproverPanel();
    });
    $("approver-panel").addEventListener("submit", saveApproverKey);
    $("approver-input").addEventListener("input", () => { $("approver-error").textContent = ""; });
    $("approver-forget").addEventListener("click", () => {
      setApproverKey(null);
      closeApproverPanel();
      toast("Approver key forgotten.");
    });
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && !$("approver-panel").hidden) closeApproverPanel();
    });
    document.addEventListener("click", (event) => {
      if (!$("approver-panel").hidden && !event.target.closest(".approver")
          && !event.target.closest(".link-button")) closeApproverPanel();
    });
  }

  start();
})();
