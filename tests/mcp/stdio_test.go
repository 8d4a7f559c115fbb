package mcp

func runStdioServer() int { return 0 }
