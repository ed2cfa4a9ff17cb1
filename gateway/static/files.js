/* The open session's workspace files: the list, kept live by the files watch socket,
 * downloads and uploads, and a cell's touched files. */

import { $, el, formatSize, saveBlob, state, toast } from "./page.js";
import { api, sessionPath, socketUrl } from "./api.js";

// -- files -------------------------------------------------------------------------------

function filePath(path) {
  return path.split("/").map(encodeURIComponent).join("/");
}

export async function refreshFiles() {
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

// -- live: the files watch socket ------------------------------------------------------------

// A burst of changes (an unzip, a build) makes one listing, at most one per this many ms.
const REFRESH_DEBOUNCE_MS = 250;
const CHANGES = new Set(["create", "write", "remove", "rename", "chmod"]);
// A watch that ended or dropped opens again once the session is seen running, with no transfer.
const RUNNING = new Set(["idle", "busy"]);
const ENDED_SETTLE_MS = 1000;

/** Follow the open session's workspace: each change refreshes the list (debounced). */
export function watchFiles(session) {
  unwatchFiles();
  const w = { sessionId: state.current, socket: null, refresh: null, waiting: false,
    ended: false, endedAt: 0 };
  state.filesWatch = w;
  if (session && (!RUNNING.has(session.status) || session.transfer)) {
    // Paused or pausing: a watch asks its session to resume, so it waits for the session.
    w.waiting = true;
    $("file-list").dataset.watch = "waiting";
    return;
  }
  openFilesSocket(w);
}

function openFilesSocket(w) {
  w.waiting = false;
  const socket = new WebSocket(
    `${socketUrl(`${sessionPath(w.sessionId)}/files/watch`)}&recursive=true`);
  w.socket = socket;
  w.ended = false;
  $("file-list").dataset.watch = "connecting";
  socket.onmessage = (message) => {
    if (w.socket !== socket) return;
    const frame = JSON.parse(message.data);
    if (CHANGES.has(frame.type)) {
      scheduleRefresh(w);
    } else if (frame.type === "ready") {
      // The watch is in place: from here no change is missed; what changed before (while
      // no socket watched, or since the first listing) shows now.
      $("file-list").dataset.watch = "live";
      refreshFiles();
    } else if (frame.type === "end") {
      // The session paused or ended (or this socket fell behind).
      w.ended = true;
      w.endedAt = Date.now();
      $("file-list").dataset.watch = "ended";
    }
  };
  socket.onclose = (event) => {
    if (w.socket !== socket || state.filesWatch !== w) return;
    w.socket = null;
    if (event.code === 4401 || event.code === 4404) {  // the session's own sockets say why
      $("file-list").dataset.watch = "offline";
      return;
    }
    // Ended or dropped: not opened again at once, since a watch resumes a paused session;
    // the next sessions list that shows this one running opens it again.
    if (!w.ended) {
      w.endedAt = Date.now();
      $("file-list").dataset.watch = "offline";
    }
    w.waiting = true;
  };
}

function scheduleRefresh(w) {
  if (w.refresh) return;
  w.refresh = setTimeout(() => {
    w.refresh = null;
    if (state.filesWatch === w) refreshFiles();
  }, REFRESH_DEBOUNCE_MS);
}

/** The open session as the sessions list last showed it: a paused watch resumes with it. */
export function filesSessionSeen(session) {
  const w = state.filesWatch;
  if (!w || !w.waiting || w.socket || session.id !== w.sessionId) return;
  if (!RUNNING.has(session.status) || session.transfer) return;
  // An answer asked for as the pause began may still say it runs: trust a later one.
  if (Date.now() - w.endedAt < ENDED_SETTLE_MS) return;
  openFilesSocket(w);
}

export function unwatchFiles() {
  const w = state.filesWatch;
  state.filesWatch = null;
  if (!w) return;
  clearTimeout(w.refresh);
  if (w.socket) { w.socket.onclose = null; w.socket.close(); }
  delete $("file-list").dataset.watch;
}

// -- downloads and uploads ---------------------------------------------------------------

async function downloadFile(path) {
  try {
    const response = await api("GET", `${sessionPath(state.current)}/files/${filePath(path)}`,
      { raw: true });
    saveBlob(await response.blob(), path.split("/").pop());
  } catch (error) {
    if (error.status !== 401) toast(`Could not download ${path}: ${error.message}`, "error");
  }
}

export async function uploadFiles() {
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

// A cell's touched files: created and modified ones download on click, deleted ones are
// only named.
export function touchedFiles(files) {
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
