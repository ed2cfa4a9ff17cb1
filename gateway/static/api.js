/* The API: fetch with the API key (or an approver's), the sockets' URLs and the session paths. */

import { hooks, state } from "./page.js";

// -- API ---------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : `request failed (${status})`);
    this.status = status;
  }
}

/** Call the API with the API key, or with `key` (an approver's: its 401 signs nobody out). */
export async function api(method, path, { json, body, raw, key } = {}) {
  const headers = { Authorization: `Bearer ${key || state.key}` };
  if (json !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method, headers, body: json !== undefined ? JSON.stringify(json) : body,
    credentials: "omit", cache: "no-store",
  });
  if (response.status === 401 && !key) {
    hooks.signOut("The API key was refused. Sign in again.");
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

export function socketUrl(path) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}${path}?token=${encodeURIComponent(state.key)}`;
}

export function sessionPath(id) { return `/v1/sessions/${encodeURIComponent(id)}`; }
