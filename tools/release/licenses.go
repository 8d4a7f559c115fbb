package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/licensecheck"
)

// licenseFile is the file name every published module folder carries: a
// module zip holds only its own folder, so pkg.go.dev looks for the licence
// there, not at the repository root.
const licenseFile = "LICENSE"

// minCoverage is the share of the licence file (percent) licensecheck must
// recognise as one known licence: stricter than pkg.go.dev, which accepts a
// file from 75%.
const minCoverage = 90

// permissive are the licence IDs (licensecheck's, SPDX) accepted here.
var permissive = map[string]bool{"MIT": true, "Apache-2.0": true, "BSD-2-Clause": true, "BSD-3-Clause": true}

// checkLicense returns the licence ID found in dir/LICENSE, or an error
// when the file is missing or is not recognised as one permissive licence
// covering at least minCoverage percent of its text.
func checkLicense(dir string) (string, error) {
	data, err := os.ReadFile(filepath.Join(dir, licenseFile))
	if err != nil {
		return "", fmt.Errorf("no %s file: %w", licenseFile, err)
	}
	cov := licensecheck.Scan(data)
	ids := map[string]bool{}
	for _, m := range cov.Match {
		ids[m.ID] = true
	}
	if len(ids) != 1 {
		var names []string
		for id := range ids {
			names = append(names, id)
		}
		return "", fmt.Errorf("%s: want one licence, licensecheck finds %d %v", licenseFile, len(ids), names)
	}
	id := cov.Match[0].ID
	switch {
	case !permissive[id]:
		return "", fmt.Errorf("%s: %s is not a permissive licence accepted here", licenseFile, id)
	case cov.Percent < minCoverage:
		return "", fmt.Errorf("%s: licensecheck recognises %.0f%% of the text as %s, want at least %d%%", licenseFile, cov.Percent, id, minCoverage)
	}
	return id, nil
}

// checkLicenses checks the root and every published module folder under
// root, and returns one error naming every folder that fails.
func checkLicenses(root string) ([]string, error) {
	mods, err := publishedModules(root)
	if err != nil {
		return nil, err
	}
	dirs := []string{"."}
	for _, m := range mods {
		dirs = append(dirs, m.Dir)
	}
	var report, problems []string
	for _, d := range dirs {
		id, err := checkLicense(filepath.Join(root, d))
		if err != nil {
			problems = append(problems, d+": "+err.Error())
			continue
		}
		report = append(report, fmt.Sprintf("%s: %s", d, id))
	}
	if len(problems) > 0 {
		return report, fmt.Errorf("licences missing or not recognised (copy the root LICENSE into each folder):\n  %s", strings.Join(problems, "\n  "))
	}
	return report, nil
}
