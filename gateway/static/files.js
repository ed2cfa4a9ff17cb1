/* The open session's workspace files: the list, downloads and uploads, and a cell's touched
 * files. */

import { $, el, formatSize, saveBlob, state, toast } from "./page.js";
import { api, sessionPath } from "./api.js";

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
