// The console's own script: local times, the confirm step, charts. No build step.
(function () {
  "use strict";

  // Times arrive as <time datetime="ISO UTC">; show them in the viewer's timezone.
  const timeFormat = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", second: "2-digit",
  });
  function localizeTimes(root) {
    root.querySelectorAll("time[datetime]:not([data-local])").forEach(function (el) {
      const at = new Date(el.getAttribute("datetime"));
      if (isNaN(at)) return;
      el.title = el.getAttribute("datetime");
      el.textContent = timeFormat.format(at);
      el.dataset.local = "1";
    });
  }

  // A datetime-local field is the viewer's local time: send it as epoch ms in the named field.
  document.addEventListener("submit", function (event) {
    const form = event.target;
    if (!(form instanceof HTMLFormElement)) return;
    form.querySelectorAll("input[data-epoch-field]").forEach(function (input) {
      const target = form.querySelector('input[name="' + input.dataset.epochField + '"]');
      if (!target) return;
      const at = input.value ? new Date(input.value) : null;
      target.value = at && !isNaN(at) ? String(at.getTime()) : "";
    });
  }, true);  // capture: before htmx or the confirm step reads the form

  // Every form with data-confirm asks first, in a <dialog> (#confirm-ok / #confirm-cancel).
  let confirmed = null;
  let asking = null;  // the form the open confirm step will submit
  function askThenSubmit(form, submitter, message) {
    const dialog = document.getElementById("confirm-dialog");
    if (!dialog || typeof dialog.showModal !== "function") {
      if (window.confirm(message)) submitConfirmed(form, submitter);
      return;
    }
    document.getElementById("confirm-message").textContent = message;
    dialog.returnValue = "";
    asking = form;
    dialog.onclose = function () {
      asking = null;
      if (dialog.returnValue === "ok") submitConfirmed(form, submitter);
    };
    dialog.showModal();
    document.getElementById("confirm-cancel").focus();
  }
  function submitConfirmed(form, submitter) {
    confirmed = form;
    if (form.requestSubmit) form.requestSubmit(submitter || undefined); else form.submit();
  }
  // A live refresh requested just before the confirm step opened must not land while it is
  // open: it would replace the form being confirmed, and the confirmed action would be lost.
  document.addEventListener("htmx:beforeSwap", function (event) {
    const target = event.detail.target;
    if (asking && target && target.contains(asking)) event.detail.shouldSwap = false;
  });
  document.addEventListener("submit", function (event) {
    const form = event.target;
    if (!(form instanceof HTMLFormElement)) return;
    const message = (event.submitter && event.submitter.dataset.confirm) || form.dataset.confirm;
    if (!message) return;
    if (confirmed === form) { confirmed = null; return; }
    event.preventDefault();
    event.stopImmediatePropagation();
    askThenSubmit(form, event.submitter, message);
  }, true);

  // A live region is not refreshed while the operator is working in it: boxes ticked, a
  // details panel open, or a field focused. Used in hx-trigger filters.
  window.ferryCanRefresh = function (id) {
    const el = document.getElementById(id);
    if (!el) return false;
    // While the confirm step is open, the form it will submit must stay in the page.
    const dialog = document.getElementById("confirm-dialog");
    if (dialog && dialog.open) return false;
    if (el.querySelector("input[type=checkbox]:checked, details[open]")) return false;
    return !el.contains(document.activeElement) || document.activeElement === document.body;
  };

  // In an outage a live refresh is answered 503 (or 507) with the API's JSON error
  // (docs/console-ui.md#outages): the region keeps what it showed, and a notice above the page
  // says why it stands still, until a refresh succeeds again.
  function outageNotice(message) {
    let notice = document.getElementById("outage");
    if (!message) {
      if (notice) notice.remove();
      return;
    }
    if (!notice) {
      notice = document.createElement("div");
      notice.id = "outage";
      notice.className = "flash flash-error";
      notice.setAttribute("role", "alert");
      notice.dataset.testid = "outage";
      const flash = document.getElementById("flash");
      if (!flash) return;
      flash.prepend(notice);
    }
    notice.textContent = message + " This page shows what it last read, and refreshes by itself.";
  }
  document.addEventListener("htmx:responseError", function (event) {
    const xhr = event.detail.xhr;
    if (!xhr || (xhr.status !== 503 && xhr.status !== 507)) return;
    let message = "The broker cannot reach its database.";
    try {
      message = JSON.parse(xhr.responseText).error.message || message;
    } catch (e) { /* not the JSON error: keep the plain message */ }
    outageNotice(message);
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    if (event.detail.successful) outageNotice(null);
  });

  // "Select all" boxes tick every box named by data-select-all.
  document.addEventListener("change", function (event) {
    const box = event.target;
    if (!box.dataset || !box.dataset.selectAll) return;
    document.querySelectorAll('input[name="' + box.dataset.selectAll + '"]').forEach(function (b) {
      b.checked = box.checked;
    });
  });

  // Charts: <div data-chart data-series-url=...> reads {"x": [...s], "series": [{"label", "values"}]}.
  const charts = [];
  const palette = ["#1f6fb2", "#c2410c", "#15803d", "#7c3aed", "#b91c1c", "#0e7490"];
  function chartSize(el) {
    return { width: Math.max(280, el.clientWidth - 8), height: Number(el.dataset.height || 220) };
  }
  function loadChart(entry) {
    return fetch(entry.el.dataset.seriesUrl, { headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (!data) return;
        const empty = entry.el.querySelector(".chart-empty");
        const drawable = data.series.some(function (s) {
          return s.values.filter(function (v) { return v !== null; }).length > 1;
        });
        if (empty) empty.hidden = drawable;
        if (!drawable) return;
        const rows = [data.x].concat(data.series.map(function (s) { return s.values; }));
        if (entry.plot && entry.labels === data.series.map(function (s) { return s.label; }).join()) {
          entry.plot.setData(rows);
          return;
        }
        if (entry.plot) entry.plot.destroy();
        entry.labels = data.series.map(function (s) { return s.label; }).join();
        const size = chartSize(entry.el);
        entry.plot = new uPlot({
          width: size.width, height: size.height,
          scales: { x: { time: true } },
          axes: [{}, { size: 60 }],
          series: [{}].concat(data.series.map(function (s, i) {
            return { label: s.label, stroke: palette[i % palette.length], width: 2, scale: "y" };
          })),
        }, rows, entry.el.querySelector(".chart-canvas"));
      })
      .catch(function () { /* the next update tries again */ });
  }
  function setupCharts(root) {
    root.querySelectorAll("[data-chart]:not([data-chart-ready])").forEach(function (el) {
      el.dataset.chartReady = "1";
      const entry = { el: el, plot: null, labels: "" };
      charts.push(entry);
      if (window.uPlot) loadChart(entry);
    });
  }
  window.addEventListener("resize", function () {
    charts.forEach(function (entry) {
      if (entry.plot) entry.plot.setSize(chartSize(entry.el));
    });
  });

  document.addEventListener("DOMContentLoaded", function () {
    localizeTimes(document);
    setupCharts(document);
    document.body.addEventListener("ferry:update", function () {
      charts.forEach(function (entry) { if (document.body.contains(entry.el)) loadChart(entry); });
    });
    // After htmx swaps a live region in, its new <time>s and charts need the same treatment.
    document.body.addEventListener("htmx:afterSettle", function () {
      localizeTimes(document);
      setupCharts(document);
    });
  });
})();
