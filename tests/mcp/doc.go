// Package mcp holds no code: its tests exercise adapters/idemmcp with the
// MCP go-sdk's real client and server, over the streamable HTTP transport
// on a TCP listener, over stdio to a child process, and over in-memory
// transports, with the memory store and Redis. They live in this module,
// not in the adapter's, so that stores and goleak stay out of the module
// graph of an application that imports idemmcp.
package mcp
