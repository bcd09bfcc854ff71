/* Set-up for the Jupyter widget manager (@jupyter-widgets/html-manager) on pages with saved widgets.
 *
 * myst-nb loads it between RequireJS and the manager (`nb_ipywidgets_js` in _config.yml). It fixes
 * two faults of the manager on a static page:
 *
 * 1. Icon fonts. The manager's bundle looks for its fonts beside its own AMD module, whose address
 *    RequireJS derives from the module's name relative to the page: `<page dir>/@jupyter-widgets/...`,
 *    which does not exist (404). Map that name to the folder the bundle is served from (this script
 *    tag's `data-html-manager-dist`).
 * 2. MathJax. The manager typesets widget labels with MathJax 2's `MathJax.Hub.Queue`; the book loads
 *    MathJax 3, which has no `Hub`, so every label threw "reading 'Queue'". Give every `MathJax`
 *    object the page sets a `Hub.Queue` that hands the labels to MathJax 3's `typesetPromise` once
 *    it is ready (MathJax 3 reads `\( \)`, not `$`, and skips the book's `mathjax_ignore` sections:
 *    the book's widget labels are plain Unicode text).
 */
(function () {
  "use strict";
  var dist = document.currentScript && document.currentScript.dataset.htmlManagerDist;
  if (dist && window.require && window.require.config) {
    window.require.config({ paths: { "@jupyter-widgets/html-manager/dist": dist.replace(/\/$/, "") } });
  }

  function mathJax3Ready() {
    return new Promise(function (resolve) {
      function check() {
        var mj = window.MathJax;
        if (mj && mj.startup && mj.startup.promise) resolve(mj.startup.promise.then(function () { return mj; }));
        else setTimeout(check, 50);
      }
      check();
    });
  }

  var hub = {
    // MathJax 2 jobs look like ["Typeset", MathJax.Hub, element]; only those are used by the manager.
    Queue: function () {
      var elements = Array.prototype.filter.call(arguments, function (job) {
        return Array.isArray(job) && job[0] === "Typeset" && job[2];
      }).map(function (job) { return job[2]; });
      if (elements.length) {
        mathJax3Ready().then(function (mj) { return mj.typesetPromise(elements); });
      }
    },
  };

  var current = window.MathJax;
  function withHub(value) {
    if (value && typeof value === "object" && !value.Hub) value.Hub = hub;
    return value;
  }
  withHub(current);
  Object.defineProperty(window, "MathJax", {
    configurable: true,
    enumerable: true,
    get: function () { return current; },
    set: function (value) { current = withHub(value); },
  });
})();
