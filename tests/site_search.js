// The site's search, as a browser runs it: Material for MkDocs' search worker (lunr and its
// ranking, with each page's search.boost) loaded in node, sent the messages the page sends it.
// node site_search.js WORKER_JS SEARCH_INDEX_JSON QUERY... -> {query: [[location, ...], ...]}
"use strict";
const fs = require("fs");
const [worker, indexPath, ...queries] = process.argv.slice(2);
const listeners = [];
globalThis.self = globalThis;
globalThis.addEventListener = (type, listener) => {
  if (type === "message") listeners.push(listener);
};
let answer = null;
globalThis.postMessage = (message) => answer && answer(message);
globalThis.importScripts = () => {};
// The worker's own code, as the browser's worker runs it (no module system, global scope).
(0, eval)(fs.readFileSync(worker, "utf8"));

function send(message) {
  return new Promise((resolve) => {
    answer = resolve;
    for (const listener of listeners) listener({ data: message });
  });
}

(async () => {
  const index = JSON.parse(fs.readFileSync(indexPath, "utf8"));
  // 0: SETUP (the index, and the options the page adds), 2: QUERY, answered by 3: RESULT.
  await send({ type: 0, data: { ...index, options: { suggest: false } } });
  const found = {};
  for (const query of queries) {
    const result = await send({ type: 2, data: query });
    found[query] = result.data.items.slice(0, 5).map((group) => group.map((d) => d.location));
  }
  process.stdout.write(JSON.stringify(found));
})();
