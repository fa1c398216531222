/* refcntd's report page: an icicle graph (root on top) of objects by allocation
 * stack, drawn from the JSON in #flame-data.  Click a frame to zoom into it, click
 * an ancestor (or "Reset zoom") to zoom out; the search box marks every frame whose
 * name holds the text and says how much of the view they account for.  No network,
 * no library: the page is one file (refcntd/outputs/html.py). */
"use strict";
window.onerror = function (message, source, line) {
  var box = document.getElementById("js-errors");
  if (box) {
    box.hidden = false;
    box.textContent += "script error: " + message + " (line " + line + ")\n";
  }
  document.documentElement.setAttribute("data-js-errors", "1");
};

(function () {
  var ROW = 18, MIN_WIDTH = 0.0005;  /* px per level; narrower frames are not drawn */
  var data = JSON.parse(document.getElementById("flame-data").textContent);
  var names = data.names, root = data.root;  /* node: [name, objects, references, kids] */
  var box = document.getElementById("flame");
  var metricBox = document.getElementById("flame-metric");
  var searchBox = document.getElementById("flame-search");
  var status = document.getElementById("flame-status");
  var metric = 1, focus = [root], query = "";

  function value(node) { return node[metric]; }
  function label(node) { return names[node[0]]; }
  function isType(node) { return node[3].length === 0 && /^\[.*\]$/.test(label(node)); }

  function hue(text) {
    var h = 0;
    for (var i = 0; i < text.length; i++) { h = (h * 31 + text.charCodeAt(i)) % 360; }
    return h;
  }

  function bar(node, depth, x, w, ancestor) {
    var el = document.createElement("div");
    var name = label(node), total = value(focus[focus.length - 1]) || 1;
    el.className = "fr" + (ancestor ? " up" : "") + (isType(node) ? " ty" : "");
    if (query && name.toLowerCase().indexOf(query) >= 0) { el.className += " hit"; }
    el.style.left = (x * 100) + "%";
    el.style.width = (w * 100) + "%";
    el.style.top = (depth * ROW) + "px";
    if (!isType(node)) { el.style.backgroundColor = "hsl(" + (20 + hue(name) % 40) + ",85%,70%)"; }
    el.textContent = name;
    el.title = name + ": " + value(node) + " " + metricBox.selectedOptions[0].text +
      " (" + (100 * value(node) / total).toFixed(1) + "%)";
    el.tabIndex = 0;
    el.addEventListener("click", function () { zoom(node); });
    el.addEventListener("keydown", function (e) { if (e.key === "Enter") { zoom(node); } });
    box.appendChild(el);
    return el;
  }

  function layout(node, depth, x, w) {
    bar(node, depth, x, w, false);
    var deepest = depth, parent = value(node) || 1, cx = x;
    node[3].forEach(function (kid) {
      var kw = w * value(kid) / parent;
      if (kw >= MIN_WIDTH && value(kid) > 0) {
        deepest = Math.max(deepest, layout(kid, depth + 1, cx, kw));
      }
      cx += kw;
    });
    return deepest;
  }

  function pathTo(target, node, trail) {
    trail.push(node);
    if (node === target) { return true; }
    for (var i = 0; i < node[3].length; i++) {
      if (pathTo(target, node[3][i], trail)) { return true; }
    }
    trail.pop();
    return false;
  }

  function zoom(node) {
    var trail = [];
    pathTo(node, root, trail);
    focus = trail.length ? trail : [root];
    render();
  }

  function matched(node) {
    if (label(node).toLowerCase().indexOf(query) >= 0) { return value(node); }
    return node[3].reduce(function (sum, kid) { return sum + matched(kid); }, 0);
  }

  function render() {
    while (box.firstChild) { box.removeChild(box.firstChild); }
    var top = focus[focus.length - 1];
    focus.slice(0, -1).forEach(function (node, depth) { bar(node, depth, 0, 1, true); });
    var deepest = layout(top, focus.length - 1, 0, 1);
    box.style.height = ((deepest + 1) * ROW) + "px";
    var unit = metricBox.selectedOptions[0].text, total = value(top);
    var text = total + " " + unit + " in view (" + label(top) + ")";
    if (query) {
      var hit = matched(top);
      text += "; matching \u201c" + searchBox.value + "\u201d: " + hit + " " + unit +
        " (" + (total ? (100 * hit / total).toFixed(1) : "0") + "%)";
    }
    status.textContent = text;
  }

  metricBox.addEventListener("change", function () { metric = Number(metricBox.value); render(); });
  searchBox.addEventListener("input", function () {
    query = searchBox.value.toLowerCase();
    render();
  });
  document.getElementById("flame-reset").addEventListener("click", function () {
    focus = [root];
    render();
  });
  render();
  document.documentElement.setAttribute("data-rendered", String(box.childNodes.length));
})();
