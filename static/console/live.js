// Ferry console: live updates over /ws/console/ (docs/console-ui.md#live-updates).
//
// The server sends {"type": "update", "changed": [...]} when something the pages show moved, at
// most once a second. This script turns each into a `ferry:update` event on document.body
// (detail: {changed}); htmx regions listen with hx-trigger="ferry:update from:body" and re-read
// their partial. When the socket drops, #live-status says "reconnecting" and the script
// reconnects with a growing pause. Each time the socket opens the page refreshes once: a change
// between rendering the page (or losing the socket) and opening it was never nudged.
(function () {
  "use strict";
  var MIN_PAUSE_MS = 500;
  var MAX_PAUSE_MS = 10000;
  var PING_MS = 25000;
  var pause = MIN_PAUSE_MS;
  var pingTimer = null;
  var lastDispatch = 0;
  var pendingChanged = null;
  var dispatchTimer = null;

  function statusEl() {
    return document.getElementById("live-status");
  }

  function setStatus(state) {
    var el = statusEl();
    if (!el) return;
    el.textContent = state === "live" ? "live" : "reconnecting";
    el.dataset.state = state;
    el.classList.toggle("is-live", state === "live");
    el.classList.toggle("is-reconnecting", state !== "live");
  }

  // At most one ferry:update a second, whatever the server sends (it already throttles).
  function dispatch(changed) {
    pendingChanged = (pendingChanged || []).concat(changed || []);
    if (dispatchTimer) return;
    var wait = Math.max(0, lastDispatch + 1000 - Date.now());
    dispatchTimer = setTimeout(function () {
      dispatchTimer = null;
      lastDispatch = Date.now();
      var detail = { changed: pendingChanged };
      pendingChanged = null;
      document.body.dispatchEvent(new CustomEvent("ferry:update", { detail: detail }));
    }, wait);
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var socket;
    try {
      socket = new WebSocket(scheme + location.host + "/ws/console/");
    } catch (e) {
      retry();
      return;
    }
    socket.onopen = function () {
      pause = MIN_PAUSE_MS;
      setStatus("live");
      // What changed between rendering the page (or the last socket) and now was never
      // nudged: the socket only reports changes from here on. Refresh once.
      dispatch(["connected"]);
      pingTimer = setInterval(function () {
        if (socket.readyState === WebSocket.OPEN) socket.send('{"type":"ping"}');
      }, PING_MS);
    };
    socket.onmessage = function (event) {
      var frame;
      try {
        frame = JSON.parse(event.data);
      } catch (e) {
        return;
      }
      if (frame.type === "update") dispatch(frame.changed);
    };
    socket.onclose = function () {
      clearInterval(pingTimer);
      setStatus("reconnecting");
      retry();
    };
  }

  function retry() {
    setTimeout(connect, pause);
    pause = Math.min(MAX_PAUSE_MS, pause * 2);
  }

  document.addEventListener("DOMContentLoaded", connect);
})();
