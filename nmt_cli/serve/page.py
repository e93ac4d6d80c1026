"""The page `nmt serve` answers at `/`: a text box (a sentence a line), the language pair (a model selector where
there are several), a translate button, n-best on demand and the time the request took, in plain HTML and a
little JavaScript calling /info and /translate. Where the server answers 401, a key field appears; the key typed
there is sent as `Authorization: Bearer KEY` (kept for the tab's session)."""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>nmt serve</title>
<style>
  body { font-family: system-ui, sans-serif; max-width: 48rem; margin: 2rem auto; padding: 0 1rem; }
  textarea { width: 100%; box-sizing: border-box; font-size: 1rem; }
  .controls { margin: .5rem 0; display: flex; gap: 1rem; align-items: center; }
  .translation { margin: .5rem 0; padding: .5rem; background: #f4f4f4; white-space: pre-wrap; }
  .warning, #error { color: #a00; }
  #time, .score { color: #666; font-size: .9rem; }
</style>
</head>
<body>
<h1>nmt <span id="pair"></span></h1>
<textarea id="source" rows="5" placeholder="One sentence per line"></textarea>
<div class="controls">
  <label id="model-label" style="display: none">model <select id="model"></select></label>
  <button id="translate">Translate</button>
  <label id="nbest-label">n-best <input id="nbest" type="number" min="1" value="1" style="width: 4rem"></label>
  <label id="key-label" style="display: none">API key <input id="key" type="password" autocomplete="off"></label>
  <span id="time"></span>
</div>
<div id="error"></div>
<div id="result"></div>
<script>
const $ = (id) => document.getElementById(id);

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function show(translation) {
  const box = element("div", "translation");
  box.appendChild(element("div", "text", translation.text));
  if (translation.warning) box.appendChild(element("div", "warning", translation.warning));
  if (translation.nbest) {
    const list = element("ol", "nbest");
    for (const h of translation.nbest) {
      const item = element("li", null, h.text + " ");
      item.appendChild(element("span", "score", h.score === null ? "(none found)" : "(" + h.score.toFixed(4) + ")"));
      list.appendChild(item);
    }
    box.appendChild(list);
  }
  $("result").appendChild(box);
}

async function call(path, options) {
  const headers = Object.assign({}, (options || {}).headers);
  const key = $("key").value || sessionStorage.getItem("nmtApiKey") || "";
  if (key) headers["Authorization"] = "Bearer " + key;
  const response = await fetch(path, Object.assign({}, options, {headers: headers}));
  if (response.status === 401) $("key-label").style.display = "";
  else if (key) sessionStorage.setItem("nmtApiKey", key);
  return response;
}

async function translate() {
  $("error").textContent = "";
  $("result").textContent = "";
  $("time").textContent = "translating...";
  const texts = $("source").value.split(/\\r?\\n/);
  const body = {texts: texts};
  if ($("model").value) body.model = $("model").value;
  const nbest = parseInt($("nbest").value, 10);
  if (nbest > 1) { body.nbest = nbest; body.beam = Math.max(nbest, window.nmtBeam || 1); }
  const start = performance.now();
  try {
    const response = await call("translate", {method: "POST", headers: {"Content-Type": "application/json"},
                                              body: JSON.stringify(body)});
    const answer = await response.json();
    const ms = performance.now() - start;
    if (!response.ok) { $("error").textContent = answer.error; $("time").textContent = ""; return; }
    answer.translations.forEach(show);
    if (!$("pair").textContent) describe();  // the key has just been given
    $("time").textContent = texts.length + " sentence(s) in " + ms.toFixed(0) + " ms";
  } catch (e) {
    $("error").textContent = "no answer from the server: " + e;
    $("time").textContent = "";
  }
}

async function describe() {
  const response = await call("info");
  const info = await response.json();
  if (!response.ok) { $("error").textContent = info.error; return; }
  if (info.models.length > 1 && !$("model").options.length) {
    for (const m of info.models) {
      const option = element("option", null, m.name + " (" + m.source_lang + " \u2192 " + m.target_lang + ")");
      option.value = m.name;
      $("model").appendChild(option);
    }
    $("model-label").style.display = "";
  }
  if ($("model").value && $("model").value !== info.models[0].name) chooseModel();  // chosen before a key was given
  else showModel(info);
}

async function chooseModel() {
  const response = await call("info?model=" + encodeURIComponent($("model").value));
  const info = await response.json();
  if (!response.ok) { $("error").textContent = info.error; return; }
  showModel(info);
}

function showModel(info) {
  $("pair").textContent = info.task === "parsing" ? "(parser, " + info.source_lang + ")"
                                                 : info.source_lang + " \\u2192 " + info.target_lang;
  window.nmtBeam = info.search.beam;
  $("nbest-label").style.display = info.task === "parsing" ? "none" : "";
}

$("translate").addEventListener("click", translate);
$("model").addEventListener("change", chooseModel);
$("source").addEventListener("keydown", (e) => { if (e.key === "Enter" && e.ctrlKey) translate(); });
describe();
</script>
</body>
</html>
"""
