// Package monitoring holds lockgate's Grafana dashboard
// (grafana-dashboard.json) and Prometheus alerting rules (alerts.yml, with
// promtool unit tests in alerts_test.yml). It has no code: its Go test
// checks that every metric and label the assets name is one a running
// lockgate exports, so a renamed metric cannot leave a silent dashboard or
// an alert that never fires.
package monitoring
