/**
 * Ferry browser client: subscribe to topics and publish over the WebSocket protocol
 * (docs/websocket.md, docs/browser.md). No dependencies, no build step.
 *
 * As a plain script it defines `window.Ferry`:
 *
 *     <script src="/static/ferry.js"></script>
 *     <script>
 *       const client = Ferry.connect("/ws/v1/", {token: "fry_..."});
 *       client.subscribe({topic: "orders", group: "web"}, async (msg) => show(msg.value));
 *     </script>
 *
 * As an ES module, import `/static/ferry.mjs` (it re-exports this file):
 *
 *     import {connect} from "/static/ferry.mjs";
 */
(function (root) {
  "use strict";

  const CLOSE_UNAUTHENTICATED = 4401;
  /**
   * The server could not do it just now (its database is away, its disk full): a subscribe or
   * an ended subscription is tried again after the error's `retry_after`, and so are an ack and
   * a publish whose messages all have an `id` (docs/operations.md).
   */
  const RETRYABLE = new Set(["unavailable", "insufficient_storage", "broker_error"]);

  function retryAfterMs(error) {
    const seconds = error.detail && error.detail.retry_after;
    return typeof seconds === "number" && seconds >= 0 ? seconds * 1000 : 1000;
  }

  const DEFAULTS = {
    /** @type {string|undefined} API key, sent as the `token` query parameter. */
    token: undefined,
    /** Reconnect after an unexpected close (never after 4401: the key is bad). */
    reconnect: true,
    minBackoffMs: 500,
    maxBackoffMs: 30000,
    /** Send a `ping` this often; no `pong` within `pingTimeoutMs` drops the connection. */
    pingIntervalMs: 20000,
    pingTimeoutMs: 10000,
    /** Acks of successful handlers are gathered this long and sent as one `ack` frame. */
    ackDelayMs: 5,
    /** How long a publish or an ack answered `unavailable` is tried again, in all. */
    maxOutageMs: 30000,
  };

  /**
   * An error frame's `error` ({code, message, detail}) as a JavaScript Error.
   */
  class FerryError extends Error {
    /** @param {{code: string, message: string, detail?: object}} error */
    constructor(error) {
      super(error.message);
      this.name = "FerryError";
      this.code = error.code;
      this.detail = error.detail || {};
    }
  }

  /** Absolute ws:// or wss:// URL: relative URLs resolve against the page, http(s) maps to ws(s). */
  function socketUrl(url, token) {
    const base = root.location ? root.location.href : undefined;
    const u = new URL(url || "/ws/v1/", base);
    if (u.protocol === "http:") u.protocol = "ws:";
    if (u.protocol === "https:") u.protocol = "wss:";
    if (token) u.searchParams.set("token", token);
    return u.toString();
  }

  function errorText(err) {
    if (err instanceof Error) return err.message || err.name;
    return typeof err === "string" ? err : JSON.stringify(err);
  }

  /**
   * One subscription: a group member on the server. Its handler runs for one message at a
   * time, in the order pushed; success acks, a throw or a rejection nacks with the error text.
   */
  class Subscription {
    /**
     * @param {Client} client
     * @param {string} id
     * @param {object} options {topic, group, filter, prefetch, from, timestampMs, memberId}
     * @param {(msg: object, sub: Subscription) => any} handler
     */
    constructor(client, id, options, handler) {
      this.client = client;
      this.id = id;
      this.options = options;
      this.handler = handler;
      /** The `subscribed` frame of the current connection (member_id, partitions, ...). */
      this.info = null;
      this.closed = false;
      this.queue = [];
      this.running = false;
      this.pendingAcks = [];
      this.ackTimer = null;
      /** Bumped per connection: receipts of an older connection are no longer valid. */
      this.epoch = 0;
      /** Resolves with the first `subscribed` frame; rejects if the server refuses. */
      this.ready = new Promise((resolve, reject) => {
        this._resolveReady = resolve;
        this._rejectReady = reject;
      });
      this.ready.catch(() => {}); // reported through the client's error event too
    }

    /** The `subscribe` frame for the current connection. */
    frame() {
      const o = this.options;
      const frame = {type: "subscribe", sub: this.id, topic: o.topic, group: o.group};
      // Broadcast members resume their own offsets only under the same member id.
      const memberId = o.memberId || (this.info && this.info.mode === "broadcast"
        ? this.info.member_id : undefined);
      if (memberId) frame.member_id = memberId;
      if (o.filter) frame.filter = o.filter;
      if (o.prefetch) frame.prefetch = o.prefetch;
      if (o.from) frame.from = o.from;
      if (o.timestampMs !== undefined) frame.timestamp_ms = o.timestampMs;
      // The name the member shows in the console: the page's own, else which page it is.
      frame.client = (o.client || ("ferry.js " + location.pathname)).slice(0, 100);
      return frame;
    }

    /** Leave the group: unsettled messages go back to it. */
    async unsubscribe() {
      if (this.closed) return;
      this.flushAcks();
      this.end();
      if (this.info && this.client.connected) {
        await this.client.request({type: "unsubscribe", sub: this.id});
      }
    }

    end() {
      this.closed = true;
      this.queue = [];
      clearTimeout(this.ackTimer);
      this.client.subs.delete(this.id);
    }

    /** A new connection: what was pushed on the old one will be redelivered. */
    reset() {
      this.epoch += 1;
      this.queue = [];
      this.pendingAcks = [];
      clearTimeout(this.ackTimer);
      this.ackTimer = null;
    }

    push(items) {
      for (const msg of items) this.queue.push({msg, epoch: this.epoch});
      if (!this.running) this.drain();
    }

    async drain() {
      this.running = true;
      while (this.queue.length && !this.closed) {
        const {msg, epoch} = this.queue.shift();
        let error = null;
        try {
          await this.handler(msg, this);
        } catch (err) {
          error = err;
        }
        if (epoch !== this.epoch || this.closed) continue;
        if (error === null) {
          this.pendingAcks.push(msg.receipt);
          if (this.ackTimer === null) {
            this.ackTimer = setTimeout(() => this.flushAcks(), this.client.options.ackDelayMs);
          }
        } else {
          this.client.settle({type: "nack", sub: this.id, receipts: [msg.receipt],
            error: errorText(error)});
        }
      }
      this.running = false;
    }

    flushAcks() {
      clearTimeout(this.ackTimer);
      this.ackTimer = null;
      if (!this.pendingAcks.length) return;
      const receipts = this.pendingAcks;
      this.pendingAcks = [];
      this.client.settle({type: "ack", sub: this.id, receipts});
    }
  }

  /**
   * A connection to /ws/v1/ that reconnects and resubscribes by itself.
   *
   * Events (an EventTarget, and `on<type>` properties or options): `open`, `close`
   * ({code, reason, willReconnect}), `error` ({error}), `subscribed`, `assigned`, `acked`,
   * `nacked` (each with the server's frame as `detail`).
   */
  class Client extends EventTarget {
    /**
     * @param {string} url e.g. "/ws/v1/" or "wss://ferry.example/ws/v1/"
     * @param {object} [options] see DEFAULTS; also onopen, onclose, onerror, WebSocket
     */
    constructor(url, options = {}) {
      super();
      this.options = Object.assign({}, DEFAULTS, options);
      this.url = socketUrl(url, this.options.token);
      this.onopen = options.onopen || null;
      this.onclose = options.onclose || null;
      this.onerror = options.onerror || null;
      /** @type {Map<string, Subscription>} */
      this.subs = new Map();
      this.pending = new Map(); // ref -> {resolve, reject}
      this.outbox = []; // publish frames waiting for a connection
      this.nextRef = 1;
      this.nextSub = 1;
      this.attempt = 0;
      this.closed = false;
      this.connected = false;
      this.ws = null;
      this.timers = {reconnect: null, ping: null, pong: null};
      this.open();
    }

    /**
     * Subscribe with a handler called once per message.
     * @param {{topic: string, group: string, filter?: object, prefetch?: number,
     *          from?: string, timestampMs?: number, memberId?: string}} options
     * @param {(msg: object, sub: Subscription) => any} handler
     * @returns {Subscription}
     */
    subscribe(options, handler) {
      const sub = new Subscription(this, `s${this.nextSub++}`, options, handler);
      this.subs.set(sub.id, sub);
      if (this.connected) this.sendSubscribe(sub);
      return sub;
    }

    /**
     * Publish messages (`{value, key, tag, headers, ...}` as in the REST produce body).
     * Resolves with the per-message results once they are committed.
     * @param {string} topic
     * @param {object|object[]} messages
     * @returns {Promise<object[]>}
     */
    async publish(topic, messages) {
      const list = Array.isArray(messages) ? messages : [messages];
      // With an id on every message, a retry stores each once: ride out an outage.
      const safe = list.every((m) => m && m.id != null);
      let waitedMs = 0;
      for (;;) {
        try {
          const reply = await this.request({type: "publish", topic, messages: list}, true);
          return reply.results;
        } catch (error) {
          const delayMs = error.code === "unavailable" ? retryAfterMs(error) : null;
          if (!safe || delayMs === null || waitedMs + delayMs > this.options.maxOutageMs) {
            throw error;
          }
          waitedMs += delayMs;
          await new Promise((resolve) => setTimeout(resolve, delayMs));
        }
      }
    }

    /** Close for good: no reconnect; pending requests are rejected. */
    close() {
      if (this.closed) return;
      for (const sub of this.subs.values()) sub.flushAcks();
      this.closed = true;
      if (this.ws) this.ws.close(1000);
      this.disconnected(1000, "closed by the client");
    }

    // Internals below: used by Subscription and the socket's callbacks.

    // Frames and requests.

    /**
     * Send a frame with a fresh `ref`; resolves with the answer, rejects on its error frame or
     * if the connection is lost first. With `queueWhileDown`, a frame sent while reconnecting
     * waits for the next connection instead of failing.
     */
    request(frame, queueWhileDown = false) {
      frame.ref = this.nextRef++;
      return new Promise((resolve, reject) => {
        const waiter = {resolve, reject};
        if (this.connected) {
          this.pending.set(frame.ref, waiter);
          this.send(frame);
        } else if (queueWhileDown && !this.closed) {
          this.outbox.push({frame, waiter});
        } else {
          reject(new FerryError({code: "not_connected", message: "Not connected."}));
        }
      });
    }

    /** ack/nack without waiting: a failure is reported as an error event. */
    settle(frame, waitedMs = 0) {
      if (!this.connected) return; // receipts die with the connection anyway
      const {ref, ...again} = frame;
      this.request(frame).then(
        (reply) => this.emit(frame.type === "ack" ? "acked" : "nacked", reply),
        (error) => {
          // Unsettled messages of a lost connection are redelivered: nothing to report.
          if (error.code === "disconnected") return;
          const delayMs = retryAfterMs(error);
          if (error.code === "unavailable" && waitedMs + delayMs <= this.options.maxOutageMs) {
            // The same receipts again: settling twice is harmless.
            setTimeout(() => this.settle(again, waitedMs + delayMs), delayMs);
            return;
          }
          this.emit("error", {error});
        },
      );
    }

    /** Subscribe again after the error's retry_after, if still wanted and connected. */
    resubscribeLater(sub, error) {
      sub.reset();
      setTimeout(() => {
        if (this.connected && !sub.closed && this.subs.get(sub.id) === sub) this.sendSubscribe(sub);
      }, retryAfterMs(error));
    }

    send(frame) {
      this.ws.send(JSON.stringify(frame));
    }

    sendSubscribe(sub) {
      this.request(sub.frame()).then(
        (reply) => {
          sub.info = reply;
          sub._resolveReady(reply);
          this.emit("subscribed", reply);
        },
        (error) => {
          // Lost with the connection: sent again on the next one.
          if (error.code === "not_connected" || error.code === "disconnected") return;
          if (RETRYABLE.has(error.code)) {
            this.emit("error", {error, sub, willRetry: true});
            this.resubscribeLater(sub, error);
            return;
          }
          sub.end();
          sub._rejectReady(error);
          this.emit("error", {error, sub});
        },
      );
    }

    // Connection lifecycle.

    open() {
      const WS = this.options.WebSocket || root.WebSocket;
      const ws = new WS(this.url);
      this.ws = ws;
      ws.onopen = () => this.opened();
      ws.onmessage = (event) => this.received(JSON.parse(event.data));
      ws.onclose = (event) => {
        if (this.ws === ws) this.disconnected(event.code, event.reason);
      };
      // A failed socket always closes next; the close event carries what matters.
      ws.onerror = () => {};
    }

    opened() {
      this.connected = true;
      this.attempt = 0;
      for (const sub of this.subs.values()) {
        sub.reset();
        this.sendSubscribe(sub);
      }
      for (const {frame, waiter} of this.outbox.splice(0)) {
        this.pending.set(frame.ref, waiter);
        this.send(frame);
      }
      this.timers.ping = setInterval(() => this.ping(), this.options.pingIntervalMs);
      // Last: a subscribe() made by an open listener must not be sent twice.
      this.emit("open", {});
    }

    ping() {
      if (this.timers.pong !== null) return;
      this.timers.pong = setTimeout(() => {
        // No pong: the connection is dead even if the browser has not noticed yet.
        const ws = this.ws;
        this.disconnected(4000, "no pong");
        ws.close();
      }, this.options.pingTimeoutMs);
      this.request({type: "ping"}).then(
        () => {
          clearTimeout(this.timers.pong);
          this.timers.pong = null;
        },
        () => {},
      );
    }

    received(frame) {
      if (frame.type === "messages") {
        const sub = this.subs.get(frame.sub);
        if (sub) sub.push(frame.items);
        return;
      }
      const waiter = frame.ref == null ? undefined : this.pending.get(frame.ref);
      if (waiter) {
        this.pending.delete(frame.ref);
        if (frame.type === "error") waiter.reject(new FerryError(frame.error));
        else waiter.resolve(frame);
        return;
      }
      if (frame.type === "assigned") {
        const sub = this.subs.get(frame.sub);
        if (sub && sub.info) Object.assign(sub.info, frame);
        this.emit("assigned", frame);
      } else if (frame.type === "error") {
        // With a `sub`: that subscription ended on the server (topic deleted, permission lost;
        // or an outage, after which it subscribes again).
        const sub = frame.sub ? this.subs.get(frame.sub) : undefined;
        const error = new FerryError(frame.error);
        const willRetry = Boolean(sub) && RETRYABLE.has(error.code);
        if (willRetry) this.resubscribeLater(sub, error);
        else if (sub) sub.end();
        this.emit("error", {error, sub, willRetry});
      }
    }

    disconnected(code, reason) {
      this.ws = null;
      this.connected = false;
      this.stopTimers();
      const willReconnect = !this.closed && this.options.reconnect
        && code !== CLOSE_UNAUTHENTICATED;
      // Answers to frames sent on this connection will never come (a publish may or may not
      // have been committed: give messages an `id` to retry safely).
      const lost = new FerryError({code: "disconnected", message: `Connection closed (${code}).`});
      for (const waiter of this.pending.values()) waiter.reject(lost);
      this.pending.clear();
      if (!willReconnect) {
        this.closed = true;
        for (const {waiter} of this.outbox.splice(0)) waiter.reject(lost);
        for (const sub of this.subs.values()) sub._rejectReady(lost);
      }
      this.emit("close", {code, reason, willReconnect});
      if (!willReconnect) return;
      // Exponential backoff with jitter, so a restarted server is not hit by every tab at once.
      const ceiling = Math.min(this.options.maxBackoffMs,
        this.options.minBackoffMs * 2 ** this.attempt);
      this.attempt += 1;
      this.timers.reconnect = setTimeout(() => this.open(), ceiling * (0.5 + Math.random() / 2));
    }

    stopTimers() {
      clearTimeout(this.timers.reconnect);
      clearInterval(this.timers.ping);
      clearTimeout(this.timers.pong);
      this.timers = {reconnect: null, ping: null, pong: null};
    }

    emit(type, detail) {
      const event = new CustomEvent(type, {detail});
      this.dispatchEvent(event);
      const callback = this[`on${type}`];
      if (typeof callback === "function") callback.call(this, event);
    }
  }

  /**
   * Open a client; it connects (and reconnects) by itself.
   * @param {string} [url] default "/ws/v1/" on the page's host
   * @param {object} [options] {token, reconnect, minBackoffMs, maxBackoffMs, pingIntervalMs,
   *   pingTimeoutMs, ackDelayMs, onopen, onclose, onerror}
   * @returns {Client}
   */
  function connect(url, options) {
    return new Client(url, options);
  }

  root.Ferry = {connect, Client, Subscription, FerryError};
})(typeof globalThis !== "undefined" ? globalThis : window);
