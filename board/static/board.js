// npuboard: fetch the panels every refresh and put them in place of the
// old ones, without reloading the page. The panels come from npuboard
// itself, drawn by its template (every string escaped); they are parsed
// by DOMParser, which runs nothing, and no script comes with them.
(function () {
  "use strict";
  var body = document.body;
  var every = (parseInt(body.getAttribute("data-refresh"), 10) || 5) * 1000;
  var fresh = document.getElementById("fresh");
  var updates = 0;
  function tick() {
    fetch("/?part=boxes", { cache: "no-store", credentials: "omit" })
      .then(function (r) {
        if (!r.ok) { throw new Error(r.status); }
        return r.text();
      })
      .then(function (text) {
        var doc = new DOMParser().parseFromString(text, "text/html");
        var next = doc.getElementById("boxes");
        var cur = document.getElementById("boxes");
        var open = {};
        if (cur) {
          cur.querySelectorAll("details[open]").forEach(function (d, i) { open[i] = true; });
        }
        if (next && cur) {
          next = document.adoptNode(next);
          next.querySelectorAll("details").forEach(function (d, i) { if (open[i]) { d.open = true; } });
          cur.replaceWith(next);
          body.setAttribute("data-updated", String(++updates));
        }
        var f = doc.getElementById("fresh");
        if (f && fresh) { fresh.textContent = f.textContent; fresh.classList.remove("stale"); }
      })
      .catch(function () {
        if (fresh) { fresh.classList.add("stale"); }
      })
      .finally(function () { setTimeout(tick, every); });
  }
  document.documentElement.classList.add("live");
  setTimeout(tick, every);
})();
