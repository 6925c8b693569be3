/**
 * Ferry browser client as an ES module: `import {connect} from "/static/ferry.mjs"`.
 * The code lives in ferry.js, which also works as a plain <script> (window.Ferry).
 */
import "./ferry.js";

const {Ferry} = globalThis;
export const {connect, Client, Subscription, FerryError} = Ferry;
export default Ferry;
