package benchmarks

import (
	"io"
	"net/http"

	"github.com/labstack/echo/v5"

	"github.com/idemkit/idem/adapters/idemechov5"
	idem "github.com/idemkit/idem/core"
)

func init() {
	frameworks = append(frameworks, framework{name: "echov5", route: route, build: buildEchoV5})
}

func buildEchoV5(e *idem.Engine) driver {
	ec := echo.New()
	if e != nil {
		ec.Use(idemechov5.New(e, idemechov5.WithScope(func(*echo.Context) string { return principal })))
	}
	h := func(c *echo.Context) error {
		_, _ = io.Copy(io.Discard, c.Request().Body)
		executions.Add(1)
		status := http.StatusCreated
		if c.Request().Method == http.MethodGet {
			status = http.StatusOK
		}
		return c.Blob(status, "application/json", respBody)
	}
	ec.POST(route, h)
	ec.GET(route, h)
	return newHTTPDriver(ec)
}
