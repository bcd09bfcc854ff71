/* The book's own scripts (registered as html_js_files in _config.yml).
 *
 * 1. Sidebar toggles. pydata-sphinx-theme 0.17 and sphinx-book-theme 1.3 attach their handlers to
 *    the FIRST `.primary-toggle` / `.secondary-toggle` of the page, which is the theme header's
 *    hidden button (pydata/pydata-sphinx-theme#2451, executablebooks/sphinx-book-theme#988); the
 *    visible buttons of the article header only showed a tooltip. Every other toggle of a kind
 *    forwards its click to the first one, which opens the drawer (phone) or collapses the sidebar
 *    (desktop) as the themes intend.
 * 2. Figures. A figure of several panels, shrunk to a phone's column, has text too small to read: every
 *    cell-output image becomes a link to its full-size file, which the reader can open and zoom.
 * 3. Provenance. `run_experiment` prints "[name] loaded from the cache: <file>" and "computed <date> on
 *    <device> in <s> s" for every cached result, and chapter 6 "<dataset>: not available on this
 *    machine"; those outputs move into one collapsed note per page, where the first of them stood.
 * 4. Claims tables. A table with a "verdict" column becomes, on a phone, one card per row with the
 *    verdict first and every value under its column's name (book.css, `table.claims-cards`).
 */
(function () {
  "use strict";

  function forwardToggles(kind) {
    var toggles = document.querySelectorAll("." + kind);
    var first = toggles[0];
    Array.prototype.slice.call(toggles, 1).forEach(function (button) {
      button.addEventListener("click", function (event) {
        event.preventDefault();
        event.stopPropagation();
        first.click();
      });
    });
  }

  function linkFigures() {
    document.querySelectorAll(".bd-content .cell_output img, .bd-content figure img").forEach(function (img) {
      if (img.closest("a")) return;
      var link = document.createElement("a");
      link.href = img.src;
      link.className = "figure-full-size";
      link.title = "Open the full-size image";
      img.parentNode.insertBefore(link, img);
      link.appendChild(img);
    });
  }

  var PROVENANCE = [
    /^\[[\w.-]+\] loaded from the cache: \S+$/,
    /^\s+computed \S+ \S+ on \S+ in [\d.]+ s$/,
    /^[\w-]+: not available on this machine \(.*\)$/,
  ];

  function isProvenance(output) {
    var pre = output.querySelector("pre");
    var lines = (pre ? pre.textContent : "").split("\n").filter(function (line) { return line.trim(); });
    return lines.length > 0 && lines.every(function (line) {
      return PROVENANCE.some(function (pattern) { return pattern.test(line); });
    });
  }

  function collapseProvenance() {
    var outputs = Array.prototype.filter.call(
      document.querySelectorAll(".bd-content .cell_output > .output.stream"), isProvenance);
    if (!outputs.length) return;
    var note = document.createElement("details");
    note.className = "provenance";
    var summary = document.createElement("summary");
    summary.textContent = "Provenance: where this page's cached results come from";
    note.appendChild(summary);
    outputs[0].parentNode.insertBefore(note, outputs[0]);
    outputs.forEach(function (output) {
      var box = output.parentNode;
      note.appendChild(output);
      if (!box.children.length) box.remove();
    });
  }

  function cardClaimsTables() {
    document.querySelectorAll(".bd-content .cell_output table").forEach(function (table) {
      var header = table.querySelector("thead tr:last-child");
      if (!header) return;
      var names = Array.prototype.map.call(header.children, function (th) { return th.textContent.trim(); });
      var verdict = names.indexOf("verdict");
      if (verdict < 0) return;
      table.classList.add("claims-cards");
      table.querySelectorAll("tbody tr").forEach(function (row) {
        Array.prototype.forEach.call(row.children, function (cell, k) {
          cell.setAttribute("data-label", names[k] || "");
          if (k === verdict) cell.classList.add("claims-verdict");
        });
      });
    });
  }

  function ready() {
    forwardToggles("primary-toggle");
    forwardToggles("secondary-toggle");
    linkFigures();
    collapseProvenance();
    cardClaimsTables();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", ready);
  else ready();
})();
