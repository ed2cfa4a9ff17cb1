/* The transcript's cells: their code, language, status and outputs as frames arrive. */

import { $, el, formatDuration, hooks, isNearBottom, scrollToEnd, state } from "./page.js";
import { api } from "./api.js";
import { setCellStatus } from "./status.js";
import { refreshFiles, touchedFiles } from "./files.js";
import { holdCell, showDecision, withdrawApproval } from "./approvals.js";
import { chartTable, renderMime } from "./output.js";
import { ANSI_RE, fixCarriageReturns, highlightPython, renderAnsi } from "./text.js";

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
// -- cells -------------------------------------------------------------------------------

export function createCell(id, code, language = "python") {
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
export async function loadLanguages(profile) {
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

export function setPlaceholder() {
  $("code").placeholder = PLACEHOLDERS[$("language").value] || PLACEHOLDERS.python;
}

export function startCell(id, code, startedAt) {
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

export function rejectCell(cell, detail) {
  cell.pending = false;
  setCellStatus(cell, "rejected");
  cell.meta.append(el("span", { class: "reason", text: detail }));
}

export function addEvent(cell, frame) {
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
    hooks.refreshSessions().catch(() => {});
  }
}
