set terminal pngcairo size 900,560 noenhanced
set output 'gpa-step.png'
set title 'GPA against AdamW, Schedule-Free and single-worker DiLoCo: memory and untuned quality'
set xlabel 'training step (inner steps)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'gpa-step.dat' index 0 with linespoints title 'adamw', 'gpa-step.dat' index 1 with linespoints title 'gpa', 'gpa-step.dat' index 2 with linespoints title 'schedule_free', 'gpa-step.dat' index 3 with linespoints title 'diloco-h32', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
