/* Status badges: a session's, a cell's, and the open session's following its cells. */

import { $, state } from "./page.js";

const STATUS_LABELS = {
  pending_approval: "waiting for approval",
  budget_exceeded: "budget exceeded",
};

export function setStatusBadge(node, status) {
  node.className = `badge badge-${status}`;
  node.textContent = status;
  return node;
}

export function setCellStatus(cell, status, text) {
  cell.node.dataset.status = status;
  cell.status.className = `badge badge-${status}`;
  cell.status.textContent = text || STATUS_LABELS[status] || status;
  if (status === "running") cell.prompt.textContent = "[*]";
  showBusy();
}

export function showBusy() {
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
