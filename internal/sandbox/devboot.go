package sandbox

import "context"

// DevBootResult reports a throwaway boot.
type DevBootResult struct {
	OK            bool   `json:"ok"`
	VMID          string `json:"vm_id"`
	Name          string `json:"name"`
	BootMS        int64  `json:"boot_ms"`
	TotalMS       int64  `json:"total_ms"`
	Accel         string `json:"accel"`
	SerialLogPath string `json:"serial_log_path"`
}

// DevBoot boots a throwaway VM without a network, runs `true` in it and
// reports how long the boot took.
func (s *Service) DevBoot(ctx context.Context) (*DevBootResult, error) {
	rep, err := s.Run(ctx, Request{Argv: []string{"true"}, NoNetwork: true, TimeoutS: 60})
	if err != nil {
		return nil, err
	}
	res := &DevBootResult{OK: true, VMID: rep.VMID, Name: rep.Name, TotalMS: rep.TotalMS, Accel: string(rep.Accel), SerialLogPath: rep.SerialLogPath}
	if rep.BootMS != nil {
		res.BootMS = *rep.BootMS
	}
	return res, nil
}
